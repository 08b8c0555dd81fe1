# stepserve: the two commands a newcomer needs are `make run` and `make test`.

# bash, for the filtered test runs below.
SHELL   := /bin/bash

# filtered runs a command (1) with its output in a file, prints the lines
# that match the extended regular expression (2), and on failure the last
# 300 lines as well, so that a filter never hides why a run failed; it
# exits with the command's status.
define filtered
log=$$(mktemp); { $(1); } >$$log 2>&1; rc=$$?; grep -E '$(2)' $$log; \
	if [ $$rc != 0 ]; then echo "--- exit status $$rc; the last 300 lines of the run:"; tail -300 $$log; fi; rm -f $$log; exit $$rc
endef
GO      ?= go
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)
# OpenBLAS behind the CPU engine's matrix products where libopenblas-dev is
# installed (make deps installs it); pure-Go gonum otherwise.
GOTAGS  ?= $(shell pkg-config --exists openblas 2>/dev/null && echo openblas)
# make run's listen address: ADDR=:9000 sets it; unset, the server's own
# (STEPSERVE_SERVER_ADDR, else :8000).
ADDR    ?=
PYTHON  ?= /usr/bin/python3
# The torch 2.x root the compile tests run the worker in (Debian 13's
# python3-torch 2.6 and what inductor needs; ~2 minutes and 1.7 GB to
# build, once): make torch2-root builds it where it is missing or broken.
TORCH2_ROOT   ?= /var/cache/stepserve/torch2-root
TORCH2_PYTHON := $(CURDIR)/engine/rbln/worker/torch2/python
# The environment that points the compiled-engine tests at the root, where
# it is built (they skip, saying so, without it; make test builds it).
# Entering the root takes root (a mount namespace, chroot): as another
# user the compile tests skip, saying why.
TORCH2_USABLE := $(and $(filter 0,$(shell id -u)),$(wildcard $(TORCH2_ROOT)/usr/bin/python3))
TORCH2_ENV     = $(if $(TORCH2_USABLE),TORCH2_PYTHON=$(TORCH2_PYTHON) TORCH2_ROOT=$(TORCH2_ROOT))

.PHONY: torch2-root all help build run test test-long generate check-generated tokenizer-files chart-test bench bench-ab bench-grpc bench-onnx bench-llama bench-lookup bench-decoder fuzz soak lint bench-generate bench-structured grafana-alerts dashboard digits digits-cnn tiny-encoder tiny-xlmr tiny-llama golden deps clean proto schema image image-rbln

all: build

## help: the targets, each with its comment
help:
	@awk '/^## [a-z-]+:/ { if (t) print t; t = $$0; sub(/^## /, "", t); next } \
		/^## / && t { l = $$0; sub(/^## /, "", l); t = t " " l; next } \
		{ if (t) print t; t = "" }' $(MAKEFILE_LIST) \
		| sed -E 's/^([a-z-]+): /\1\t/' | while IFS=$$'\t' read -r target text; do \
			printf '  make %-16s ' "$$target"; echo "$$text" | fold -s -w 80 | sed '2,$$s/^/                        /'; done

## build: the server binary at bin/stepserve
build:
	$(GO) build -tags "$(GOTAGS)" -ldflags "$(LDFLAGS)" -o bin/stepserve ./cmd/serve

## run: build, then serve ./model_repository with the CPU engine on :8000
## (or ADDR=host:port, or STEPSERVE_SERVER_ADDR)
run: build
	./bin/stepserve --model_repository ./model_repository $(if $(ADDR),--server.addr $(ADDR))

HELM_VERSION := v3.22.0
HELM         := $(CURDIR)/bin/helm-$(HELM_VERSION)
# An older Helm the chart must also lint and template with (3.19 refused
# an enum holding both "0" and 0, which 3.22 accepts).
HELM_COMPAT_VERSION := v3.19.5
HELM_COMPAT         := $(CURDIR)/bin/helm-$(HELM_COMPAT_VERSION)
# staticcheck 2026.2.2 is module version v0.8.2 of honnef.co/go/tools.
STATICCHECK_VERSION := v0.8.2
STATICCHECK         := $(CURDIR)/bin/staticcheck-$(STATICCHECK_VERSION)

## deps: everything the tests need: Go modules (the server's, deploy/test's
## and Helm, built from its module), and Debian's python3-torch (the rbln
## worker, run on torch's CPU here), libopenblas-dev, prometheus, and
## python3-protobuf and python3-grpc-tools (which parse the Triton answers
## as the protocol's messages); installs with apt as root; and the torch
## 2.x root (make torch2-root). After it, make test runs offline.
deps: deps-host torch2-root

## torch2-root: a Debian 13 root with torch 2.6 (python3-torch,
## libtorch-dev, g++) at TORCH2_ROOT, in which the tests compile steps with
## inductor (Debian 12's torch 1.13 has no torch.compile); built once with
## debootstrap, again only when missing or broken
torch2-root:
	@if [ "$$(id -u)" != 0 ]; then echo "make torch2-root: not root: no torch 2.x root (building and entering it take root); the compile tests will skip"; \
	elif engine/rbln/worker/torch2/build-root --check $(TORCH2_ROOT); then \
		echo "make torch2-root: $(TORCH2_ROOT) has torch $$(TORCH2_ROOT=$(TORCH2_ROOT) $(TORCH2_PYTHON) -c 'import torch; print(torch.__version__)' 2>/dev/null)"; \
	else echo "make torch2-root: building $(TORCH2_ROOT) (about 2 minutes, 1.7 GB)"; engine/rbln/worker/torch2/build-root $(TORCH2_ROOT); fi

.PHONY: deps-host
# npm ci with a deadline, tried three times: npm (11.x) now and then
# hangs for good after fetching a package's tarball, mid-extraction; a
# second try from a clean node_modules takes seconds.
NPM_CI = for try in 1 2 3; do rm -rf node_modules; timeout 180 npm ci --ignore-scripts --no-audit --no-fund --prefer-offline && break; \
	echo "make deps: npm ci in $$PWD failed or hung (try $$try of 3)"; [ $$try != 3 ] || exit 1; done

deps-host: $(HELM) $(HELM_COMPAT) $(STATICCHECK)
	@echo "make deps: Go modules (go mod download, deploy/test, Helm $(HELM_VERSION) and $(HELM_COMPAT_VERSION)), npm's @huggingface/tokenizers (the tokenizer reference test, pinned by models/testdata/tokref/package-lock.json) and openai with zod (the OpenAI Node SDK tests, server/testdata/openai-sdk), the AI SDK and LangChain.js (server/testdata/js-frameworks), @anthropic-ai/sdk (server/testdata/anthropic-sdk) and @huggingface/inference (the Hugging Face JS client test, server/testdata/hf-inference) and, where missing, Debian's python3-torch, libopenblas-dev, pkg-config, prometheus, python3-protobuf, python3-grpcio, python3-grpc-tools, protobuf-compiler"
	$(GO) mod download
	cd deploy/test && $(GO) mod download
	cd deploy/test && $(GO) mod download k8s.io/kubernetes@v1.37.2 github.com/kedacore/keda/v2@v2.21.0  # schemas not in go.mod (schemas_test.go pins them)
	@if [ -f models/testdata/tokref/node_modules/@huggingface/tokenizers/package.json ]; then :; \
	elif command -v npm >/dev/null; then cd models/testdata/tokref && $(NPM_CI); \
	else echo "make deps: no npm; the tokenizer.json reference test (transformers.js) will skip"; fi
	@if [ -f server/testdata/openai-sdk/node_modules/openai/package.json ] && [ -f server/testdata/openai-sdk/node_modules/zod/package.json ]; then :; \
	elif command -v npm >/dev/null; then cd server/testdata/openai-sdk && $(NPM_CI); \
	else echo "make deps: no npm; the OpenAI Node SDK test will skip"; fi
	@if [ -f server/testdata/js-frameworks/node_modules/ai/package.json ] && [ -f server/testdata/js-frameworks/node_modules/@langchain/openai/package.json ]; then :; \
	elif command -v npm >/dev/null; then cd server/testdata/js-frameworks && $(NPM_CI); \
	else echo "make deps: no npm; the AI SDK and LangChain.js test will skip"; fi
	@if [ -f server/testdata/anthropic-sdk/node_modules/@anthropic-ai/sdk/package.json ]; then :; \
	elif command -v npm >/dev/null; then cd server/testdata/anthropic-sdk && $(NPM_CI); \
	else echo "make deps: no npm; the Anthropic SDK test will skip"; fi
	@if [ -f server/testdata/hf-inference/node_modules/@huggingface/inference/package.json ]; then :; \
	elif command -v npm >/dev/null; then cd server/testdata/hf-inference && $(NPM_CI); \
	else echo "make deps: no npm; the Hugging Face JS client test will skip"; fi
	@missing=""; \
	$(PYTHON) -c 'import torch' 2>/dev/null || missing="$$missing python3-torch"; \
	$(PYTHON) -c 'import google.protobuf, grpc, grpc_tools' 2>/dev/null || missing="$$missing python3-protobuf python3-grpcio python3-grpc-tools"; \
	command -v protoc >/dev/null || missing="$$missing protobuf-compiler"; \
	pkg-config --exists openblas 2>/dev/null || missing="$$missing libopenblas-dev pkg-config"; \
	command -v promtool >/dev/null && command -v prometheus >/dev/null || missing="$$missing prometheus"; \
	if [ -n "$$missing" ]; then \
		echo "installing$$missing"; \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $$missing; \
	fi

## test: install what the tests need, then run every test in its short
## form (Go: the concurrent packages with the race detector, the others
## without, side by side; the kernel sets this CPU runs, the worker's
## Python unit tests on torch 1.13 and, in the torch 2.x root, compiling
## with inductor, the chart and the alert rules); README's "Testing" says
## what a fresh and a warm run cost
test: deps
	@$(MAKE) --no-print-directory -j2 test-race test-plain
	$(GO) test -short -count=1 -timeout 5m -tags purego ./engine/cpufallback  # the portable path too (pure Go, gonum)
	@echo "CPU engine kernel sets on this machine ($$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')):"
	@$(call filtered,$(GO) test -count=1 -timeout 5m -tags "$(GOTAGS)" -run '^TestEveryKernelSetMatchesTorch$$' -v ./engine/cpufallback,^ +--- (PASS|SKIP|FAIL)|kernelsets_test.go:[0-9]+: kernel set .*(cannot|no AVX))
	cd engine/rbln/worker && $(PYTHON) -m unittest discover -s tests -t .
	@if [ -n "$(TORCH2_USABLE)" ]; then echo "The worker's tests again on torch 2.x (the root), compiling with inductor:"; \
		cd engine/rbln/worker && REQUIRE_COMPILE_TESTS=1 TORCH2_ROOT=$(TORCH2_ROOT) $(TORCH2_PYTHON) -m unittest discover -s tests -t .; \
	else echo "make test: no torch 2.x root to enter (make torch2-root, as root): the worker's compile tests ran on torch 1.13 only, skipped"; fi
	$(MAKE) chart-test

# RACE_PKGS are the packages whose code runs concurrently (the doors and
# their core, the live model set, the batcher, the generation loop, the
# worker's supervisor, configuration reloads, the tracer): they run under
# the race detector. The rest (numerics, tokenizers, buckets, the step
# runner, and cmd/serve's end-to-end tests, whose server binary is built
# without the detector whatever the test binary is) run without it, in a
# second go test beside the first.
RACE_PKGS = ./server/... ./serving/... ./batching/... ./generation/... ./engine/rbln/... ./config/... ./internal/trace/...
RACE_RE   = /stepserve/(server|serving|batching|generation|engine/rbln|config|internal/trace)(/|$$)
GOTEST_TAGS = -tags "$$(pkg-config --exists openblas && echo openblas)"
.PHONY: test-race test-plain
test-race:
	$(TORCH2_ENV) $(GO) test -race -short -count=1 -timeout 30m $(GOTEST_TAGS) $(RACE_PKGS)
test-plain:
	$(TORCH2_ENV) $(GO) test -short -count=1 -timeout 30m $(GOTEST_TAGS) $$($(GO) list ./... | grep -vE '$(RACE_RE)')

## test-long: the long tests (CI runs them after make test): retraining
## the shipped models in a fresh clone, twice; every shipped model compiled
## with inductor in the torch 2.x root and audited, and tiny-llama served
## compiled (100 completions, every program one graph, nothing found by the
## audit); the tokenizers on 1 MB
## hostile texts; the long soak and overload forms (make soak); each fuzz
## target for FUZZTIME_LONG
# A count of inputs, not a duration: go1.26's fuzzing coordinator can fail
# a duration-bounded run with "context deadline exceeded" as the time ends
# (golang/go#75804, fixed in go1.27), which a count never reaches.
FUZZTIME_LONG ?= 100000x
test-long: deps build
	@$(call filtered,$(GO) test -count=1 -timeout 30m -v -run '^(TestFreshCloneBuildsAndRetrains|TestHostileTextIsLinear)$$' ./cmd/serve ./models/tokenizers,^(=== RUN|--- |ok|FAIL|PASS)|_test.go:[0-9]+: )
	@$(call filtered,$(TORCH2_ENV) $(GO) test -count=1 -timeout 20m -v -run '^TestAuditOfShippedModels$$' ./engine/rbln,^(=== RUN|--- |ok|FAIL|PASS)|_test.go:[0-9]+: )
	@$(call filtered,$(TORCH2_ENV) $(GO) test -count=1 -timeout 20m -v -run '^TestCompiledTinyLlamaServingRun$$' ./cmd/serve,^(=== RUN|--- |ok|FAIL|PASS)|_test.go:[0-9]+: )
	$(MAKE) soak
	$(MAKE) fuzz FUZZTIME=$(FUZZTIME_LONG)

$(STATICCHECK):
	GOBIN=$(CURDIR)/bin/staticcheck-build $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	mv $(CURDIR)/bin/staticcheck-build/staticcheck $(STATICCHECK) && rmdir $(CURDIR)/bin/staticcheck-build

$(CURDIR)/bin/helm-%:
	GOBIN=$(CURDIR)/bin/helm-build-$* $(GO) install helm.sh/helm/v3/cmd/helm@$*
	mv $(CURDIR)/bin/helm-build-$*/helm $@ && rmdir $(CURDIR)/bin/helm-build-$*

## chart-test: helm lint/template (Helm from its Go module, pinned), promtool
## check/test of the alert rules, and the deploy tests: manifests decoded
## into Kubernetes types, PromQL against the exported metrics, a real
## Prometheus firing an alert on a real server
chart-test: $(HELM) $(HELM_COMPAT) build
	$(HELM) lint --strict deploy/helm/stepserve
	$(HELM_COMPAT) lint --strict deploy/helm/stepserve
	$(HELM_COMPAT) template stepserve deploy/helm/stepserve >/dev/null
	promtool check rules deploy/helm/stepserve/files/stepserve-rules.yaml
	promtool test rules deploy/prometheus/stepserve-rules.test.yaml
	cd deploy/test && HELM=$(HELM) HELM_COMPAT=$(HELM_COMPAT) STEPSERVE=$(CURDIR)/bin/stepserve $(TORCH2_ENV) $(GO) test -count=1 -timeout 10m ./...

## lint: gofmt, go vet, staticcheck (pinned; it finds dead code) and
## go mod tidy -diff (every module's requirements as tidy writes them), for
## the server's module and deploy/test's. A finding is fixed, or kept with a
## //lint:ignore line (or a package's staticcheck.conf) that says why.
lint: $(STATICCHECK)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags purego ./engine/cpufallback
	cd deploy/test && $(GO) vet ./...
	$(STATICCHECK) ./...
	@if pkg-config --exists openblas 2>/dev/null; then echo "$(STATICCHECK) -tags openblas ./..."; $(STATICCHECK) -tags openblas ./...; \
	else echo "make lint: no libopenblas-dev (make deps installs it): the openblas build is not checked"; fi
	$(STATICCHECK) -tags purego ./...
	cd deploy/test && $(STATICCHECK) ./...
	$(GO) mod tidy -diff
	cd deploy/test && $(GO) mod tidy -diff

FUZZTIME ?= 60s
FUZZ_TARGETS := server/wire:FuzzDecodeJSON server/wire:FuzzDecodeBinary server/wire:FuzzParseWire engine/rbln:FuzzReadFrame \
	models:FuzzParseSafetensors models:FuzzParseConfig models:FuzzTokenizer models:FuzzTokensMatchTheReference server/wire:FuzzCheckLimits \
	models/tokenizers:FuzzEncode server/triton:FuzzReadConfig models/gguf:FuzzParse

## fuzz: run every fuzz target for FUZZTIME each (make test runs their seed corpora)
fuzz:
	@for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; name=$${t##*:}; \
		out=$$($(GO) test -timeout 10m ./$$pkg -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) 2>&1); rc=$$?; \
		execs=$$(echo "$$out" | grep -o 'execs: [0-9]*' | tail -1); \
		printf '%-22s %-12s %s\n' "$$name" "$$( [ $$rc = 0 ] && echo ok || echo FAILED)" "$$execs"; \
		[ $$rc = 0 ] || { echo "$$out" | tail -30; exit 1; }; \
	done

## soak: the long forms of the overload, drain, repository-churn and soak
## tests (bounded, loopback only), with their summaries
soak: build
	@$(call filtered,STEPSERVE_SOAK=1 $(GO) test -count=1 -timeout 30m -v ./cmd/serve -run 'TestOverload|TestDrainUnderLoad|TestRepositoryChangesUnderLoad|TestHungWorkerUnderLoad|TestWorkerKilledMidLoad|TestSoak',^(=== RUN|--- |ok|FAIL|PASS)|_test.go:[0-9]+: [A-Za-z0-9])

## bench: every benchmark in one run, written to bench/REPORT.md (and
## printed): HTTP serving against the plain net/http baseline and the
## FastAPI + PyTorch peer with wrk, gRPC beside HTTP (h2load, bench/grpcload),
## dynamic batching, engine steps against
## OpenBLAS, allocations. Installs what it needs with apt (as root).
bench: deps build
	@missing=""; command -v wrk >/dev/null || missing="wrk"; command -v h2load >/dev/null || missing="$$missing nghttp2-client"; \
	$(PYTHON) -c 'import fastapi, uvicorn' 2>/dev/null || missing="$$missing python3-fastapi python3-uvicorn"; \
	$(PYTHON) -c 'import numpy' 2>/dev/null || missing="$$missing python3-numpy"; \
	[ -e /usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 ] || missing="$$missing libopenblas0"; \
	if [ -n "$$missing" ]; then apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $$missing; fi
	$(GO) build -o bin/baseline ./bench/baseline
	$(GO) build -o bin/grpcload ./bench/grpcload
	GOTAGS="$(GOTAGS)" $(GO) run ./bench/run -d $(BENCHTIME)
	$(MAKE) bench-onnx
	$(MAKE) bench-llama
	$(MAKE) bench-lookup
	$(MAKE) bench-decoder
	$(MAKE) bench-structured

BENCHTIME ?= 9s

## bench-structured: constrained decoding on the CPU engine (issue 48):
## decode tokens/s at 1 and 16 streams with a json_schema (10 properties,
## nested arrays) against the same without, and the mask's host time per
## token (median, p99) at the decoder's vocabulary and at 128k tokens
## (bench/structured)
bench-structured:
	$(GO) run ./bench/structured

## bench-pool: a pool of 3 tiny-llama servers on loopback (issue 50): one
## skewed chat workload (shared system prompts, Zipf popularity, bursts)
## routed round-robin and then by GAIE's endpoint-picker scheduler fed by
## its own metrics client, p50/p99 time to first token and the pool's
## prefix-cache hit rate side by side (deploy/test/pool_test.go, about a
## minute); the table is written to POOL_BENCH_OUT too.
POOL_BENCH_OUT ?= $(CURDIR)/bench/out/pool.md
.PHONY: bench-pool
bench-pool: build
	mkdir -p $(dir $(POOL_BENCH_OUT))
	cd deploy/test && STEPSERVE=$(CURDIR)/bin/stepserve POOL_BENCH=1 POOL_BENCH_OUT=$(POOL_BENCH_OUT) $(GO) test -count=1 -run 'TestPoolBenchmark$$' -v -timeout 10m .

## bench-onnx: the CPU engine's encoder step against ONNX Runtime
## (onnxruntime-node from npm, bench/onnx/package-lock.json) on an encoder of
## all-MiniLM-L6-v2's dimensions with random weights, built and exported to
## ONNX by Debian's torch from the golden-encoder module (under bench/out,
## not shipped); interleaved rounds in one run, ratios with their spread,
## outputs checked against torch's, every kernel set this build and CPU run
## (avx512, avx512+bf16, avx2, go: the BLAS), and the server's HTTP
## binary path on the same cases (issue 20). ORT_ROUNDS, ORT_SECONDS,
## ORT_KERNELS (e.g. avx512,avx2).
ORT_ROUNDS  ?= 7
ORT_SECONDS ?= 0.7
ORT_KERNELS ?= all
bench-onnx: build
	@command -v npm >/dev/null || { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends nodejs npm; }
	cd bench/onnx && npm ci --no-audit --no-fund
	$(GO) run -tags "$(GOTAGS)" ./bench/ortpeer -python $(PYTHON) -rounds $(ORT_ROUNDS) -seconds $(ORT_SECONDS) -kernels $(ORT_KERNELS) -server bin/stepserve

## bench-decoder: the decoder's steps as device graphs (issue 45): on the
## torch engine in the torch 2.x root, decode tokens/s compiled with
## inductor against eager at 1 and 16 sequences, and decode time per token
## at a 64-token context with max_model_len 1024 against 128 (a step reads
## its context partition); the CPU engine's decode step at the same two
## lengths. Compare the lines of one run.
bench-decoder: deps
	$(GO) test -run '^$$' -bench DecodeContext -benchtime 2s ./engine/cpufallback
	$(TORCH2_ENV) $(GO) test -run '^$$' -bench CompiledDecoder -benchtime 30x -timeout 30m ./engine/rbln

## bench-generate: the CPU engine's generation on a SmolLM-135M-shaped random
## decoder: prefill and decode tokens/s at one sequence, aggregate decode at
## 16 concurrent streams, time to first token (bench/generate)
bench-generate:
	$(GO) run ./bench/generate

## bench-lookup: speculative decoding by prompt lookup against plain
## decoding on a SmolLM-135M shape, interleaved: a model that quotes its
## prompt (whole, and with edits) and a random model's looping text;
## decode tokens/s, the share of drafted tokens kept, and whether the
## text is the same (bench/lookup, issue 51). LOOKUP_DTYPE: f32, bf16 or
## q8_0.
LOOKUP_DTYPE ?= f32
bench-lookup:
	$(GO) run ./bench/lookup -rounds 3 -streams 1,4 -dtype $(LOOKUP_DTYPE)

## bench-llama: generation against llama.cpp (node-llama-cpp's prebuilt CPU
## build from npm, pinned by bench/llama/package-lock.json) on random
## decoders of the shapes LLAMA_SHAPES (smollm: SmolLM-135M; qwen0.5b:
## Qwen2.5-0.5B; llama1b: Llama-3.2-1B) served by bin/stepserve in float32,
## bfloat16, Q8_0 and Q4_0 (quantization: q8_0, q4_0) and written as f32,
## f16, Q8_0 and Q4_0 GGUF for llama.cpp (LLAMA_FORMATS: f32,bf16,q8_0,q4_0;
## empty: each shape's default, no f32 or q4_0 for llama1b): greedy tokens checked against llama.cpp (and PyTorch for
## SmolLM float32) first, then prefill of a 512-token prompt (tokens/s and
## time to first token), decode tokens/s at one sequence and aggregate
## decode at LLAMA_STREAMS streams against llama.cpp's 8 sequences on one
## context, each with the bytes a token reads and the share of the memory
## bandwidth measured in the same run (bench/llamapeer, issues 31 and 51);
## written to bench/REPORT-generation.txt too. LLAMA_THREADS: threads on
## each side (empty: every CPU; on a 2-CPU machine llama.cpp's spinning
## threads collapse at 2, so use 1).
LLAMA_ROUNDS  ?= 3
LLAMA_STREAMS ?= 16
LLAMA_SHAPES  ?= smollm,qwen0.5b,llama1b
LLAMA_FORMATS ?=
LLAMA_THREADS ?=
bench-llama: build
	@command -v npm >/dev/null || { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends nodejs npm; }
	cd bench/llama && npm ci --no-audit --no-fund --omit=optional --ignore-scripts
	$(GO) run ./bench/llamapeer -python $(PYTHON) -rounds $(LLAMA_ROUNDS) -streams $(LLAMA_STREAMS) -shape $(LLAMA_SHAPES) \
		$(if $(LLAMA_FORMATS),-formats $(LLAMA_FORMATS)) $(if $(LLAMA_THREADS),-threads $(LLAMA_THREADS)) -server bin/stepserve | tee bench/REPORT-generation.txt

## bench-grpc: make bench's gRPC sections alone, printed: single-row
## digits over gRPC beside HTTP, and large inputs (digits 32 rows, the
## encoder at 64 texts) over HTTP binary, gRPC raw and system shared
## memory, with the server's CPU per request (bench/run -only grpc)
bench-grpc: build
	@command -v wrk >/dev/null && command -v h2load >/dev/null || { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends wrk nghttp2-client; }
	$(GO) build -o bin/grpcload ./bench/grpcload
	GOTAGS="$(GOTAGS)" $(GO) run ./bench/run -only grpc -d $(BENCHTIME)

## bench-ab: the single-row digits load over HTTP JSON, binary tensors and
## gRPC on two builds, interleaved round by round: BASE (a git revision,
## default HEAD~1) against the working tree (bench/ab/ab.sh; needs wrk, bc)
BASE ?= HEAD~1
bench-ab: build
	@command -v wrk >/dev/null && command -v bc >/dev/null || { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends wrk bc; }
	$(GO) build -o bin/grpcload ./bench/grpcload
	rm -rf bench/out/base && git worktree add -f --detach bench/out/base $(BASE)
	cd bench/out/base && $(GO) build -o ../stepserve-base ./cmd/serve; rc=$$?; cd $(CURDIR) && git worktree remove --force bench/out/base && exit $$rc
	bench/ab/ab.sh bench/out/stepserve-base bin/stepserve $(AB_ROUNDS) $(AB_SECONDS)
AB_ROUNDS  ?= 9
AB_SECONDS ?= 3

## digits: retrain the shipped digits model from data/ (reproducible)
digits:
	$(GO) run ./cmd/train-digits -data data/digits.csv.gz

## digits-cnn: retrain the shipped PyTorch example (model_repository/digits-cnn)
## on the same rows, the same held out (reproducible: the same bytes every run
## on one machine; torch picks its kernels by CPU)
digits-cnn:
	$(PYTHON) model_repository/digits-cnn/train.py

clean:
	rm -rf bin

## tokenizer-files: regenerate the test tokenizer.json files under
## models/testdata/tokenizers from their corpus
tokenizer-files:
	cd models/tokenizers && $(GO) test -count=1 -timeout 5m -run '^TestGeneratedFilesAreCurrent$$' -update .

# What the generators write, but the torch references (make golden).
GENERATED := deploy/helm/stepserve/values.schema.json deploy/helm/stepserve/files/grafana-alerts.json deploy/helm/stepserve/files/dashboard.json server/inferencepb models/testdata/tokenizers \
	model_repository/tiny-encoder model_repository/tiny-xlmr model_repository/tiny-reranker \
	model_repository/tiny-llama

## generate: run every generator: the chart's schema, server/inferencepb
## (proto), the test tokenizer files, the demo models (tiny-encoder,
## tiny-xlmr, tiny-reranker) and the torch references (golden, which needs
## Debian's python3-torch and writes bytes that depend on the CPU)
generate: schema grafana-alerts dashboard proto tokenizer-files tiny-encoder tiny-xlmr tiny-llama golden

## check-generated: run every generator but the torch references and fail
## when any generated file differs from what they write (the tree is left
## as it was). The torch references are float output whose last bits
## depend on the CPU; the tests hold the engines to them within tolerances.
check-generated:
	@set -e; tmp=$$(mktemp -d); mkdir $$tmp/before $$tmp/now; \
	tar cf $$tmp/before.tar $(wildcard $(GENERATED)); tar xf $$tmp/before.tar -C $$tmp/before; \
	trap 'rm -rf $(GENERATED); tar xf $$tmp/before.tar; rm -rf $$tmp' EXIT; \
	rc=0; $(MAKE) --no-print-directory schema grafana-alerts dashboard proto tokenizer-files tiny-encoder tiny-xlmr tiny-llama >$$tmp/log 2>&1 || rc=$$?; \
	tar cf - $(wildcard $(GENERATED)) | tar xf - -C $$tmp/now; \
	if [ $$rc != 0 ]; then cat $$tmp/log; exit $$rc; fi; \
	if ! diff -r --brief $$tmp/before $$tmp/now; then \
		echo "check-generated: stale: run make generate (schema, grafana-alerts, dashboard, proto, tokenizer-files, tiny-encoder, tiny-xlmr, tiny-llama) and commit what it writes"; exit 1; fi; \
	echo "check-generated: every generated file is current ($(GENERATED))"

## dashboard: regenerate the chart's Grafana dashboard (files/dashboard.json)
## from its definition in cmd/gen-dashboard (Grafana's Go SDK)
dashboard:
	$(GO) run ./cmd/gen-dashboard -chart deploy/helm/stepserve

## grafana-alerts: regenerate the chart's Grafana-managed alert rules
## (files/grafana-alerts.json) from its Prometheus rules, with Grafana's Go
## SDK (a test fails while it is not current)
grafana-alerts:
	$(GO) run ./cmd/gen-grafana-alerts -chart deploy/helm/stepserve

## schema: regenerate the chart's values.schema.json from the server's
## configuration keys (a test fails while it is not current)
schema:
	$(GO) run ./cmd/gen-schema -chart deploy/helm/stepserve

IMAGE       ?= ghcr.io/stepserve/stepserve:$(VERSION)
RBLN_WHEELS ?= rbln-wheels
# The first of buildah, podman and docker found builds the images.
CONTAINER_BUILD = tool=$$(for t in buildah podman docker; do command -v $$t >/dev/null && { echo $$t; break; }; done); \
	[ -n "$$tool" ] || { echo "make image: needs buildah, podman or docker (none is installed)"; exit 1; }; \
	case $$tool in buildah) sub=bud;; *) sub=build;; esac; \
	echo "building with $$tool"; \
	$$tool $$sub -f Containerfile --build-arg VERSION=$(VERSION)

## image: the server image (cpu and torch engines), tagged $(IMAGE)
image:
	@$(CONTAINER_BUILD) --target runtime -t $(IMAGE) .

## image-rbln: the NPU image, with torch_rbln installed from the wheels in
## $(RBLN_WHEELS) (see the Containerfile), tagged $(IMAGE)-rbln
image-rbln:
	@[ -d "$(RBLN_WHEELS)" ] || { echo "make image-rbln: $(RBLN_WHEELS)/ holds no torch_rbln wheels: download torch_rbln and the torch it needs from Rebellions' index into it, or set RBLN_WHEELS"; exit 1; }
	@$(CONTAINER_BUILD) --target rbln --build-arg RBLN_WHEELS=$(RBLN_WHEELS) -t $(IMAGE)-rbln .

## tiny-encoder: regenerate the shipped demo encoder (random weights, fixed seed)
tiny-encoder:
	$(GO) run ./cmd/gen-tiny-encoder -out model_repository/tiny-encoder

## tiny-xlmr: regenerate the shipped demo Hub folders tiny-xlmr (embedder) and
## tiny-reranker (cross-encoder): XLM-R layout, Unigram tokenizer.json,
## random weights, fixed seed
tiny-xlmr:
	$(GO) run ./cmd/gen-tiny-xlmr -repo model_repository

## tiny-llama: regenerate the shipped demo language model (Llama layout,
## byte-level BPE with ChatML's tokens and template, random weights, fixed
## seed)
tiny-llama:
	$(GO) run ./cmd/gen-tiny-llama -repo model_repository

## golden: regenerate the encoder references (BERT; every family and head) from torch (Debian python3-torch); not run by `make test`
golden:
	/usr/bin/python3 engine/cpufallback/testdata/golden_encoder.py engine/cpufallback/testdata/encoder
	/usr/bin/python3 engine/cpufallback/testdata/golden_families.py engine/cpufallback/testdata/families

## proto: regenerate server/inferencepb from proto/inference.proto
## (stepserve's statement of the protocol: the published names and field
## numbers) with pinned generators: protoc from Debian bookworm's
## protobuf-compiler, protoc-gen-go and protoc-gen-go-grpc at the versions
## go.mod's tool lines pin.
PROTOC_VERSION := 3.21.12
PROTO_PKG      := github.com/stepserve/stepserve/server/inferencepb
proto:
	@protoc --version | grep -qx 'libprotoc $(PROTOC_VERSION)' || { echo "make proto needs protoc $(PROTOC_VERSION) (Debian's protobuf-compiler), found: $$(protoc --version)"; exit 1; }
	$(GO) build -o bin/protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go
	$(GO) build -o bin/protoc-gen-go-grpc google.golang.org/grpc/cmd/protoc-gen-go-grpc
	protoc -I proto \
		--plugin=protoc-gen-go=bin/protoc-gen-go --plugin=protoc-gen-go-grpc=bin/protoc-gen-go-grpc \
		--go_out=server/inferencepb --go_opt=paths=source_relative \
		--go-grpc_out=server/inferencepb --go-grpc_opt=paths=source_relative \
		inference.proto
