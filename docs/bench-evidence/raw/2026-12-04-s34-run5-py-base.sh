#!/bin/sh
# python3 on the .base tree (session 34's A side: the commit before the decode-graph fill change);
# run from .base so `-m engine.cli` imports its engine before the working tree's
cd "$(dirname "$0")/../.base" && exec python3 "$@"
