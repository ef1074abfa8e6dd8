#!/bin/sh
# Make sure a NAT tool (nft, else iptables) exists for tests/multinode/test_nat.py, which
# builds a masquerading router namespace. Called by `make .venv/.nat`, which never fails on
# it: when it cannot install, it says why, exits 1 (the stamp is not written, the next
# `make test` tries again) and the NAT test skips saying what is missing.
if command -v nft >/dev/null 2>&1 || command -v iptables >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "nat: neither nft nor iptables, and not root: run 'apt-get install -y nftables'" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "nat: neither nft nor iptables, and no apt-get here; the NAT test will skip" >&2
    exit 1
fi
echo "nat: installing nftables"
if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q nftables >/tmp/burn-remote-apt-nat.log 2>&1; then
    apt-get update -q >/dev/null 2>&1
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q nftables >/tmp/burn-remote-apt-nat.log 2>&1 \
        || { echo "nat: apt-get failed (see /tmp/burn-remote-apt-nat.log):" >&2; tail -3 /tmp/burn-remote-apt-nat.log >&2; exit 1; }
fi
command -v nft >/dev/null 2>&1
