# The scenario runner (sourced by tests/e2e/run, and by tests/e2e/selftest/run, which checks it
# against scenarios that fail in each way a scenario can).
# shellcheck shell=bash

# run_scenarios RESULTS SCENARIO...: runs each scenario file with bash, its output in
# RESULTS/<name>.log, and reports it PASS (exit 0), SKIP (exit 77) or FAIL (any other exit,
# a time limit included). Prints "N passed, N failed, N skipped" last; returns 1 if any failed.
#
# Before each scenario, `before_scenario NAME` runs when the caller defines it (tests/e2e/run
# waits there for the cluster to settle); if it fails, the scenario is not run and counts as
# failed.
# E2E_SCENARIO_TIMEOUT (default 900) limits each scenario, in seconds. With E2E_RUN_DEADLINE
# (seconds since the epoch; CI sets it), a scenario starts only while E2E_SCENARIO_RESERVE
# seconds (default 480, above the longest scenario's time) are left before it; the rest are
# SKIPPED, saying so, and a started one is cut before the deadline, its cleanup included.
run_scenarios() {
    local results=$1
    shift
    mkdir -p "$results"
    local passed=0 failed=0 skipped=0 failed_names=() scenario name limit left start took rc
    local deadline=${E2E_RUN_DEADLINE:-0} reserve=${E2E_SCENARIO_RESERVE:-480}
    # A timed-out scenario gets this long for its cleanup before it is killed.
    local grace=60
    for scenario in "$@"; do
        name=$(basename "$scenario" .sh)
        limit=${E2E_SCENARIO_TIMEOUT:-900}
        if ((deadline)); then
            left=$((deadline - $(date +%s)))
            if ((left < reserve)); then
                skipped=$((skipped + 1))
                log "SKIP $name: only ${left} s left before the run's deadline (a scenario needs up to ${reserve} s)"
                continue
            fi
            ((left - grace - 20 < limit)) && limit=$((left - grace - 20))
        fi
        start=$SECONDS
        rc=0
        : >"$results/$name.log"
        if declare -F before_scenario >/dev/null && ! before_scenario "$name" >>"$results/$name.log" 2>&1; then
            rc=unsettled
        else
            timeout --kill-after="$grace" "$limit" bash "$scenario" >>"$results/$name.log" 2>&1 || rc=$?
        fi
        took=$((SECONDS - start))
        case $rc in
            0) passed=$((passed + 1)); log "PASS $name (${took}s)"
               # What it measured, into the summary (the logs go with the cluster).
               grep -h 'measured:' "$results/$name.log" | sed 's/^/    /' >&2 || true ;;
            77) skipped=$((skipped + 1))
                log "SKIP $name (${took}s): $(grep -m1 'SKIP:' "$results/$name.log" | sed 's/.*SKIP: //')" ;;
            *) failed=$((failed + 1)); failed_names+=("$name")
               log "FAIL $name (${took}s), $(exit_reason "$rc" "$limit"); last lines of $results/$name.log:"
               tail -25 "$results/$name.log" | sed 's/^/    /' >&2 ;;
        esac
    done
    echo "$passed passed, $failed failed, $skipped skipped"
    ((failed == 0)) || { log "failed: ${failed_names[*]}"; return 1; }
}

exit_reason() {
    case $1 in
        124) echo "cut after its limit of $2 s" ;;
        137) echo "killed after its limit of $2 s (its cleanup did not end in time)" ;;
        unsettled) echo "not run: the cluster did not settle before it" ;;
        *) echo "exit $1" ;;
    esac
}
