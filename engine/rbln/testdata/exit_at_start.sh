#!/bin/sh
# A worker interpreter that dies before its handshake, as a broken Python
# install does (fault tests only).
echo "ModuleNotFoundError: No module named 'torch' (fake)" >&2
exit 1
