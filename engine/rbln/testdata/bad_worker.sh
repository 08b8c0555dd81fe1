#!/bin/sh
# Runs testdata/bad_worker.py in place of the real worker (fault tests only).
exec /usr/bin/python3 "$(dirname "$0")/bad_worker.py"
