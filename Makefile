# stepserve: the two commands a newcomer needs are `make run` and `make test`.

GO      ?= go
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)
ADDR    ?= :8000
PYTHON  ?= /usr/bin/python3

.PHONY: all build run test lint digits tiny-encoder golden deps clean

all: build

## build: the server binary at bin/stepserve
build:
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/stepserve ./cmd/serve

## run: build, then serve ./models on $(ADDR) with the CPU engine
run: build
	./bin/stepserve --model_repository ./models --server.addr $(ADDR)

## deps: everything the tests need: Go modules, and Debian's python3-torch
## for the rbln worker (run on torch's CPU here); installs with apt as root
deps:
	$(GO) mod download
	@$(PYTHON) -c 'import torch' 2>/dev/null || { \
		echo "installing python3-torch for the rbln worker tests"; \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3-torch; }

## test: install what the tests need, then run every test (Go with the race
## detector, and the worker's Python unit tests)
test: deps
	$(GO) test -race -count=1 ./...
	cd engine/rbln/worker && $(PYTHON) -m unittest discover -s tests -t .

## lint: gofmt and go vet
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

## digits: retrain the shipped digits model from ../shared/data (reproducible)
digits:
	$(GO) run ./cmd/train-digits -data ../shared/data/digits.csv.gz

clean:
	rm -rf bin

## tiny-encoder: regenerate the shipped demo encoder (random weights, fixed seed)
tiny-encoder:
	$(GO) run ./cmd/gen-tiny-encoder -out models/tiny-encoder

## golden: regenerate the encoder reference from torch (Debian python3-torch); not run by `make test`
golden:
	/usr/bin/python3 engine/cpufallback/testdata/golden_encoder.py engine/cpufallback/testdata/encoder
