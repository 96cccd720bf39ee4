#!/bin/bash
# Builds what a real node of the test cluster needs, into the control plane's cache
# (default ~/.cache/treadle-k8s-1.20; run build_control_plane.sh first: it brings the
# source tree, Go and the apt lists):
#   - containerd 1.6, runc 1.1, the CNI plugins (only `loopback` is used) and
#     debootstrap, Debian bookworm packages unpacked with dpkg -x into $T/prefix as
#     etcd already is (nothing installed system-wide);
#   - the kubelet, `make WHAT=cmd/kubelet` in the cached source tree (reuses the
#     control plane's Go build cache: about a minute or two when it is warm);
#   - the pause binary, static, from the source tree's build/pause/linux/pause.c;
#   - a minimal Debian root filesystem with Python 3.11 by debootstrap (about a minute).
# Each part is skipped when already present. The images themselves are packed by
# tests/k8s/node_images.py from these.
set -euo pipefail
T=${TREADLE_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/treadle-k8s-1.20}
P=$T/prefix
K=$T/kubernetes-1.20.2
N=$T/node
[ -f "$T"/sources.list ] && [ -d "$K" ] && [ -x "$P"/usr/lib/go-1.19/bin/go ] \
  || { echo "the control plane's cache is missing in $T: run build_control_plane.sh first" >&2; exit 1; }
A="-o Dir::Etc::sourcelist=$T/sources.list -o Dir::Etc::sourceparts=/dev/null -o Dir::State::Lists=$T/lists -o Dir::Cache=$T/apt-cache"
MIRROR=$(grep -m1 -oE '^deb \[[^]]*\] [^ ]+' "$T"/sources.list | awk '{print $NF}')
mkdir -p "$N"/debs

if ! [ -x "$P"/usr/bin/containerd ] || ! [ -x "$P"/usr/sbin/runc ] || ! [ -x "$P"/usr/lib/cni/loopback ] \
   || ! [ -x "$P"/usr/sbin/debootstrap ]; then
  echo "== containerd, runc, CNI plugins, debootstrap (Debian packages, dpkg -x into $P)"
  (cd "$N"/debs && apt-get $A download containerd runc containernetworking-plugins debootstrap)
  for f in "$N"/debs/*.deb; do dpkg -x "$f" "$P"; done
fi

if ! [ -x "$K"/_output/bin/kubelet ]; then
  echo "== kubelet (make WHAT=cmd/kubelet in $K)"
  export GOROOT=$P/usr/lib/go-1.19 PATH=$P/usr/lib/go-1.19/bin:$P/wrap:$PATH GOCACHE=$T/gocache CGO_ENABLED=0 GOPROXY=off
  export KUBE_GIT_VERSION=v1.20.2 KUBE_GIT_MAJOR=1 KUBE_GIT_MINOR=20 KUBE_GIT_TREE_STATE=clean
  unset GOPATH GOFLAGS GO111MODULE
  time make -C "$K" WHAT=cmd/kubelet GOLDFLAGS="-s -w"
fi

if ! [ -x "$N"/pause ]; then
  echo "== pause (static, from $K/build/pause/linux/pause.c)"
  gcc -Os -Wall -static -DVERSION=v3.4-treadle -o "$N"/pause.tmp "$K"/build/pause/linux/pause.c
  strip "$N"/pause.tmp && mv "$N"/pause.tmp "$N"/pause
fi

if ! [ -f "$N"/base-rootfs/.complete ]; then
  echo "== Debian bookworm + Python by debootstrap from $MIRROR"
  rm -rf "$N"/base-rootfs
  time DEBOOTSTRAP_DIR=$P/usr/share/debootstrap "$P"/usr/sbin/debootstrap --variant=minbase \
    --include=python3,python3-venv --keyring=/usr/share/keyrings/debian-archive-keyring.gpg \
    bookworm "$N"/base-rootfs "$MIRROR"
  # Smaller and reproducible-ish: no downloaded .debs, apt lists or logs in the image.
  rm -rf "$N"/base-rootfs/var/cache/apt/archives/*.deb "$N"/base-rootfs/var/lib/apt/lists/* \
    "$N"/base-rootfs/var/log/* "$N"/base-rootfs/usr/share/doc/* "$N"/base-rootfs/usr/share/man/*
  touch "$N"/base-rootfs/.complete
fi
ls -la "$P"/usr/bin/containerd "$P"/usr/sbin/runc "$K"/_output/bin/kubelet "$N"/pause
