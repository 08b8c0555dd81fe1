#!/bin/bash
# ab.sh BASE_BIN NEW_BIN [ROUNDS] [SECONDS]: the same load on two stepserve
# binaries serving the shipped models on the CPU engine, interleaved round
# by round (base, new, base, new, ...), and each figure's median with the
# new/base ratio: single-row digits over HTTP JSON and binary tensors (wrk
# -t1 -c64) and over gRPC (bench/grpcload, 64 streams on one connection).
# Loopback only; both servers stop when it ends.
set -euo pipefail
base=$1 new=$2 rounds=${3:-5} secs=${4:-3}
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$dir"' EXIT
row='[0,0,2,13,16,14,1,0,0,0,11,12,7,16,3,0,0,0,9,3,2,16,3,0,0,0,0,0,9,11,0,0,0,0,2,11,15,13,3,0,0,0,4,15,16,13,3,0,0,0,0,14,8,0,0,0,0,0,5,15,4,0,0,0]'
printf '{"inputs":[{"name":"pixels","datatype":"FP32","shape":[1,64],"data":%s}]}' "$row" > "$dir/json.body"
hdr='{"inputs":[{"name":"pixels","datatype":"FP32","shape":[1,64],"parameters":{"binary_data_size":256}}],"outputs":[{"name":"probabilities","parameters":{"binary_data":true}}]}'
/usr/bin/python3 - "$dir/bin.body" "$hdr" "$row" <<'PY'
import json, struct, sys
open(sys.argv[1], "wb").write(sys.argv[2].encode() + struct.pack("<64f", *json.loads(sys.argv[3])))
PY
printf 'wrk.method = "POST"\nlocal f = io.open("%s", "rb")\nwrk.body = f:read("*all")\nf:close()\nwrk.headers["Content-Type"] = "application/json"\n' "$dir/json.body" > "$dir/json.lua"
printf 'wrk.method = "POST"\nlocal f = io.open("%s", "rb")\nwrk.body = f:read("*all")\nf:close()\nwrk.headers["Content-Type"] = "application/octet-stream"\nwrk.headers["Inference-Header-Content-Length"] = "%d"\n' "$dir/bin.body" "${#hdr}" > "$dir/bin.lua"

start() { # bin http grpc metrics
	"$1" --server.addr "127.0.0.1:$2" --server.grpc_addr "127.0.0.1:$3" --server.metrics_addr "127.0.0.1:$4" \
		--model_repository model_repository --log.level error >"$dir/$2.log" 2>&1 &
	for _ in $(seq 200); do curl -sf "127.0.0.1:$2/v2/health/ready" >/dev/null && return; sleep 0.1; done
	echo "server $1 did not become ready" >&2; cat "$dir/$2.log" >&2; exit 1
}
start "$base" 18101 18102 18103
start "$new" 18201 18202 18203
rps() { # kind port
	case $1 in
	json|bin) wrk -t1 -c64 -d"${secs}s" -s "$dir/$1.lua" "http://127.0.0.1:$2/v2/models/digits/infer" | awk '/Requests\/sec/ {print $2}' ;;
	grpc) bin/grpcload -addr "127.0.0.1:$(($2 + 1))" -c 64 -d "${secs}s" | sed -n 's/.* rps \([0-9.]*\).*/\1/p' ;;
	esac
}
for kind in json bin grpc; do
	: >"$dir/$kind.base"; : >"$dir/$kind.new"
done
for r in $(seq "$rounds"); do
	for kind in json bin grpc; do
		rps $kind 18101 >>"$dir/$kind.base"
		rps $kind 18201 >>"$dir/$kind.new"
	done
done
median() { sort -g "$1" | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
printf '%-12s %12s %12s %8s   (req/s, median of %d rounds of %ss)\n' load base new new/base "$rounds" "$secs"
for kind in json bin grpc; do
	b=$(median "$dir/$kind.base") n=$(median "$dir/$kind.new")
	printf '%-12s %12.0f %12.0f %8.3f   rounds: base %s / new %s\n' "$kind" "$b" "$n" "$(echo "$n / $b" | bc -l)" \
		"$(tr '\n' ' ' <"$dir/$kind.base")" "$(tr '\n' ' ' <"$dir/$kind.new")"
done
