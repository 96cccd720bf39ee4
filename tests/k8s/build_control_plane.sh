#!/bin/bash
# Builds kube-apiserver, kube-controller-manager and kube-scheduler v1.20.2 from Debian
# bookworm's source package `kubernetes`, with Debian's Go 1.19, into a per-machine
# cache outside the repository (default ~/.cache/treadle-k8s-1.20). Nothing is
# installed system-wide: .debs are unpacked with dpkg -x. Cold: about 8-10 min on
# 2 cores; a second run finds the binaries and exits at once.
# Adapted from ../shared/k8s-test-cluster/ (the team's recipe).
set -euo pipefail
T=${TREADLE_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/treadle-k8s-1.20}
P=$T/prefix
K=$T/kubernetes-1.20.2
BIN=$K/_output/bin
if [ -x "$BIN/kube-apiserver" ] && [ -x "$BIN/kube-controller-manager" ] \
   && [ -x "$BIN/kube-scheduler" ] && [ -x "$P/usr/bin/etcd" ]; then
  echo "control plane cached in $T"; exit 0
fi
mkdir -p "$T"/lists/partial "$T"/debs "$P"
# deb-src is not enabled here: a private sources list for the mirror apt already uses,
# read from the URIs:/deb lines (not comments), never hard-coded.
MIRROR=${MIRROR:-$( { grep -hE '^(URIs:|deb )' /etc/apt/sources.list /etc/apt/sources.list.d/*.sources \
  /etc/apt/sources.list.d/*.list 2>/dev/null || true; } | grep -oE 'https?://[^ ]+/debian/?' \
  | grep -v security | head -n 1)}
[ -n "$MIRROR" ] || { echo "no Debian mirror found in the apt sources" >&2; exit 1; }
echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR bookworm main" > "$T"/sources.list
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR bookworm main" >> "$T"/sources.list
A="-o Dir::Etc::sourcelist=$T/sources.list -o Dir::Etc::sourceparts=/dev/null -o Dir::State::Lists=$T/lists -o Dir::Cache=$T/apt-cache"
mkdir -p "$T"/apt-cache/archives/partial
apt-get $A update
[ -f "$T"/kubernetes_1.20.5+really1.20.2.orig.tar.gz ] || \
  (cd "$T" && apt-get $A source --download-only kubernetes=1.20.5+really1.20.2-1.1+deb12u1)
(cd "$T"/debs && apt-get $A download golang-1.19-go golang-1.19-src rsync libpopt0 etcd-server \
    golang-github-modern-go-reflect2-dev golang-github-json-iterator-go-dev)
for f in "$T"/debs/*.deb; do dpkg -x "$f" "$P"; done
mkdir -p "$P"/wrap
printf '#!/bin/sh\nLD_LIBRARY_PATH=%s/usr/lib/x86_64-linux-gnu exec %s/usr/bin/rsync "$@"\n' "$P" "$P" > "$P"/wrap/rsync
chmod +x "$P"/wrap/rsync
rm -rf "$K"
tar -C "$T" -xzf "$T"/kubernetes_1.20.5+really1.20.2.orig.tar.gz
# Go >= 1.18 crashes k8s 1.20's vendored reflect2 v1.0.1 on CRD requests: use Debian's
# reflect2 1.0.2 and json-iterator 1.1.12 instead.
rm -rf "$K"/vendor/github.com/modern-go/reflect2 "$K"/vendor/github.com/json-iterator/go
cp -a "$P"/usr/share/gocode/src/github.com/modern-go/reflect2 "$K"/vendor/github.com/modern-go/
cp -a "$P"/usr/share/gocode/src/github.com/json-iterator/go "$K"/vendor/github.com/json-iterator/
find "$K"/vendor/github.com/modern-go/reflect2 "$K"/vendor/github.com/json-iterator/go -name '*_test.go' -delete
rm -rf "$K"/vendor/github.com/json-iterator/go/*_tests "$K"/vendor/github.com/json-iterator/go/benchmarks
export GOROOT=$P/usr/lib/go-1.19 PATH=$P/usr/lib/go-1.19/bin:$P/wrap:$PATH GOCACHE=$T/gocache CGO_ENABLED=0 GOPROXY=off
export KUBE_GIT_VERSION=v1.20.2 KUBE_GIT_MAJOR=1 KUBE_GIT_MINOR=20 KUBE_GIT_TREE_STATE=clean
unset GOPATH GOFLAGS GO111MODULE
make -C "$K" WHAT="cmd/kube-apiserver cmd/kube-controller-manager cmd/kube-scheduler" GOLDFLAGS="-s -w"
ls -la "$BIN" "$P"/usr/bin/etcd
