#!/usr/bin/env bash
# Stops the nginx that start.sh started (by its pid file) and waits until it has exited.
set -euo pipefail
prefix=${NGINX_PREFIX:-/tmp/reqwest-throttle-nginx}
pidfile="$prefix/nginx.pid"
[ -f "$pidfile" ] || exit 0
pid=$(cat "$pidfile")
if kill -0 "$pid" 2>/dev/null; then
    kill -QUIT "$pid"
    for _ in $(seq 1 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then kill -TERM "$pid"; fi
fi
rm -f "$pidfile"
echo "nginx stopped"
