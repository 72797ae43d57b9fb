#!/usr/bin/env bash
# System packages the test suite uses, from Debian's archive when missing (root + apt only):
# chromium (real-browser tests, driven by playwright) and docker-compose (validates compose.yaml
# without a Docker engine); etcd-server, openssl and curl (tests/kube: the real control plane
# of ../shared/k8s).
set -euo pipefail
need=()
command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ] || need+=(chromium)
command -v docker-compose >/dev/null 2>&1 || need+=(docker-compose)
for tool in etcd:etcd-server openssl:openssl curl:curl; do
  command -v "${tool%%:*}" >/dev/null 2>&1 || need+=("${tool#*:}")
done
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing Debian packages for the tests: ${need[*]} ..."
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
else
  echo "missing ${need[*]} and this user cannot apt-get them: the tests that need them will be skipped" >&2
fi
