#!/bin/bash
# tests/tools/as_nobody.sh CMD...: run CMD as the unprivileged user nobody, as on a student's laptop.
# Call it inside `unshare -m --propagation private` (as root): the mounts below stay in that namespace.
# This machine's Python lives in /root (mode 700), which nobody cannot enter: cover /root with a tmpfs
# and bind the interpreter's folder back, the same way the grader's sandbox does for its ranks.
set -e
python_home=$(readlink -f "$(dirname "$(readlink -f "$0")")/../../.venv/bin/python")
prefix=$(dirname "$(dirname "$python_home")")   # e.g. /root/.pyenv/versions/3.11.7
case "$prefix" in
  /root/*)
    mkdir -p /tmp/.as-nobody-python
    mount --bind "$prefix" /tmp/.as-nobody-python
    mount -t tmpfs -o mode=0755 tmpfs /root
    mkdir -p "$prefix"
    mount --bind /tmp/.as-nobody-python "$prefix"
    ;;
esac
exec setpriv --reuid=65534 --regid=65534 --clear-groups env HOME=/tmp "$@"
