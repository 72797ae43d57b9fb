#!/usr/bin/env bash
# System packages the test suite uses, from Debian's archive when missing (root + apt only):
# chromium (real-browser tests, driven by playwright), docker-compose (validates compose.yaml
# without an engine), and for the compose test on a real engine (tests/deploy/
# test_compose_engine.py, scripts/compose_engine.sh): docker.io (dockerd, containerd, runc, the
# CLI), debootstrap (the python:3.11-slim stand-in where no registry is reachable) and git;
# etcd-server, openssl and curl (tests/kube: the real control plane of ../shared/k8s);
# libjemalloc2, the allocator's and node agent's malloc where installed (services/common/malloc.py).
set -euo pipefail
need=()
command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ] || need+=(chromium)
command -v docker-compose >/dev/null 2>&1 || need+=(docker-compose)
for tool in etcd:etcd-server openssl:openssl curl:curl; do
  command -v "${tool%%:*}" >/dev/null 2>&1 || need+=("${tool#*:}")
done
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
command -v git >/dev/null 2>&1 || need+=(git)
case "$(/sbin/ldconfig -p 2>/dev/null)" in *"libjemalloc.so.2 "*) ;; *) need+=(libjemalloc2) ;; esac
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing Debian packages for the tests: ${need[*]} ..."
  # the tests start their own dockerd: keep the package from starting the host's one
  policy=/usr/sbin/policy-rc.d
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy"
    trap 'rm -f "$policy"' EXIT
  fi
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
else
  echo "missing ${need[*]} and this user cannot apt-get them: the tests that need them will be skipped" >&2
fi
