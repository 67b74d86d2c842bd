#!/bin/sh
# A shell-script wrapper that starts Python: pyrun must measure the interpreter it starts.
here="$(cd "$(dirname "$0")" && pwd)"
exec "${PYTHON:-python3}" "$here/call_chain.py" "$@"
