#!/usr/bin/env bash
# Reserve 2 MiB huge pages and mount hugetlbfs so dataplane's shared regions (shm fabrics) can
# live on huge pages. Needs root. Usage: tools/hugepages.sh [PAGES] (default 512 = 1 GiB).
#
# Without this, dataplane still works: it falls back to 4 KiB pages and logs one warning.
set -euo pipefail
pages=${1:-512}
if [ "$(id -u)" != 0 ]; then
    echo "hugepages.sh: needs root (sudo $0 $pages)" >&2
    exit 1
fi
cur=$(cat /proc/sys/vm/nr_hugepages)
if [ "$cur" -lt "$pages" ]; then
    echo "$pages" > /proc/sys/vm/nr_hugepages
fi
got=$(cat /proc/sys/vm/nr_hugepages)
if [ "$got" -lt "$pages" ]; then
    echo "hugepages.sh: asked for $pages huge pages, the kernel gave $got (memory fragmented? try at boot: hugepages=$pages)" >&2
    exit 1
fi
mkdir -p /dev/hugepages
if ! grep -q " /dev/hugepages hugetlbfs " /proc/mounts; then
    mount -t hugetlbfs -o pagesize=2M none /dev/hugepages
fi
echo "hugepages.sh: $(grep HugePages_Free /proc/meminfo | awk '{print $2}') of $got 2 MiB pages free, hugetlbfs on /dev/hugepages"
