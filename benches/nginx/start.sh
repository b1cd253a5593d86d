#!/usr/bin/env bash
# Starts nginx on loopback as a rate-limited upstream (see nginx.conf.template).
#
#   benches/nginx/start.sh      # renders the config into $NGINX_PREFIX and starts nginx as a daemon
#   benches/nginx/stop.sh
#
# Environment (defaults): NGINX_PREFIX (/tmp/reqwest-throttle-nginx), NGINX_PORT (18080),
# UPSTREAM_PORT (18081), NGINX_RATE (50 requests/s), NGINX_BURST (20), NGINX_PARALLEL (10),
# NGINX_RETRY_AFTER_MS (off; on: also a retry-after-ms header), NGINX_HINTS (on; off: refusals
# carry no Retry-After, retry-after-ms or rate_limit_type), NGINX (the nginx binary on PATH,
# else /usr/sbin/nginx).
#
# nginx proxies /v1/chat and /v1/stream to 127.0.0.1:$UPSTREAM_PORT, a small Rust server that
# the test (tests/nginx.rs) and the benchmark (examples/goodput.rs) start themselves.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
prefix=${NGINX_PREFIX:-/tmp/reqwest-throttle-nginx}
port=${NGINX_PORT:-18080}
upstream=${UPSTREAM_PORT:-18081}
rate=${NGINX_RATE:-50}
burst=${NGINX_BURST:-20}
parallel=${NGINX_PARALLEL:-10}
nginx_bin=${NGINX:-$(command -v nginx || echo /usr/sbin/nginx)}
if [ ! -x "$nginx_bin" ]; then
    echo "start.sh: nginx not found (apt-get install nginx-light)" >&2
    exit 1
fi

if [ -f "$prefix/nginx.pid" ] && kill -0 "$(cat "$prefix/nginx.pid")" 2>/dev/null; then
    "$here/stop.sh"
fi
mkdir -p "$prefix/logs" "$prefix/tmp"
chmod 755 "$prefix"
# retry-after-ms on limit_req refusals: the next token is at most 1/rate away.
# Off by default (only Retry-After, whole seconds); NGINX_RETRY_AFTER_MS=on adds it.
retry_ms=$(( (1000 + rate - 1) / rate ))
if [ "${NGINX_RETRY_AFTER_MS:-off}" != on ]; then retry_ms=; fi
hints=
if [ "${NGINX_HINTS:-on}" = off ]; then hints='# '; fi
sed -e "s|@PREFIX@|$prefix|g" -e "s|@PORT@|$port|g" -e "s|@UPSTREAM_PORT@|$upstream|g" \
    -e "s|@RATE@|$rate|g" -e "s|@BURST@|$burst|g" -e "s|@PARALLEL@|$parallel|g" \
    -e "s|@RETRY_AFTER_MS@|\"$retry_ms\"|g" -e "s|@HINTS@|$hints|g" \
    "$here/nginx.conf.template" >"$prefix/nginx.conf"
# -e: never touch the compiled-in error log path; -p: every relative path under the prefix.
"$nginx_bin" -e "$prefix/logs/error.log" -p "$prefix" -c "$prefix/nginx.conf" -t -q
"$nginx_bin" -e "$prefix/logs/error.log" -p "$prefix" -c "$prefix/nginx.conf"

# Wait until it answers (bash's /dev/tcp: no curl needed).
for _ in $(seq 1 100); do
    if exec 3<>"/dev/tcp/127.0.0.1/$port" 2>/dev/null; then
        printf 'GET /health HTTP/1.0\r\nHost: localhost\r\n\r\n' >&3
        status=$(head -n 1 <&3 || true)
        exec 3<&- 3>&-
        case "$status" in
        *" 200 "*)
            echo "nginx $("$nginx_bin" -v 2>&1 | sed 's|.*/||') on 127.0.0.1:$port" \
                "(limit_req ${rate}r/s burst=$burst nodelay, limit_conn $parallel," \
                "upstream 127.0.0.1:$upstream), prefix $prefix"
            exit 0
            ;;
        esac
    fi
    sleep 0.1
done
echo "start.sh: nginx did not answer on 127.0.0.1:$port; see $prefix/logs/error.log" >&2
exit 1
