#!/bin/sh
# The real worker on an RBLN device emulated on the host (tests only): see
# emulated_rbln.py. The supervisor runs it as it runs the interpreter.
exec /usr/bin/python3 "$(dirname "$0")/emulated_rbln.py" "$@"
