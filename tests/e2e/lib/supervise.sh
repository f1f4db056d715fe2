# supervise.sh COMMANDS LOGDIR: runs each line "name command args..." of COMMANDS, each logging to
# LOGDIR/name.log, and starts again any that exits (after a second), the way a node's init system
# would. Run as PID 1 of a PID namespace: when it dies, everything it started dies with it.
# `kill -TERM $(cat LOGDIR/name.pid)` restarts one program (a kubelet restart, say).
set -uo pipefail
commands=$1 logdir=$2

run_forever() {
    local name=$1
    shift
    while true; do
        echo "$(date +%T) starting $name" >>"$logdir/$name.log"
        "$@" >>"$logdir/$name.log" 2>&1 &
        echo $! >"$logdir/$name.pid"
        wait $!
        echo "$(date +%T) $name exited with $?" >>"$logdir/$name.log"
        sleep 1
    done
}

while read -r name cmd; do
    [[ -z $name || $name == \#* ]] && continue
    # shellcheck disable=SC2086 # the command line is split into words on purpose
    run_forever "$name" $cmd &
done <"$commands"
wait
