#!/usr/bin/env bash
# run python in the .base tree (an older checkout of engine/ and cuda/) for A/B runs
cd "$(dirname "$0")/../.base" && export PYTHONPATH=/tmp/site:$PWD && exec python3 "$@"
