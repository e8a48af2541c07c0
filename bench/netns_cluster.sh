#!/bin/sh
# Runs COMMAND as every rank of a cluster of network namespaces on one machine, each host's link
# shaped with tc (root only). The work is in netns_cluster.py beside this file (standard library
# only, so the python3 that runs it needs nothing installed); see its docstring, or --help.
#   sudo bench/netns_cluster.sh 2 2 1gbit -- python3 -c 'import pycollective as pc; pc.init()'
# PYTHON names the interpreter that runs the cluster itself (default python3).
exec "${PYTHON:-python3}" "$(dirname "$0")/netns_cluster.py" "$@"
