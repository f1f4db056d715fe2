# The scenario runner (sourced by tests/e2e/run, and by tests/e2e/selftest/run, which checks it
# against scenarios that fail in each way a scenario can).
# shellcheck shell=bash

# run_scenarios RESULTS SCENARIO...: runs each scenario file with bash, its output in
# RESULTS/<name>.log, and reports it PASS (exit 0), SKIP (exit 77) or FAIL (any other exit,
# a time limit included). Prints "N passed, N failed, N skipped" last; returns 1 if any failed.
#
# Lanes: a scenario whose file has a line `# e2e-lane: NAME` touches only what it makes (its
# namespace, its classes, its volumes: no node, driver or kubelet stopped, no pool filled, no
# node cordoned, nothing counted cluster-wide). The scenarios of one lane run one after another,
# the lanes side by side, all before the scenarios without a lane, which run alone, one at a
# time. E2E_LANES=off runs every scenario alone.
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
    local verdicts=$results/.verdicts
    : >"$verdicts"
    local scenario lane alone=() lanes=() pids=() pid
    declare -A in_lane=()
    for scenario in "$@"; do
        lane=$(scenario_lane "$scenario")
        if [[ -z $lane ]]; then
            alone+=("$scenario")
            continue
        fi
        [[ -v in_lane[$lane] ]] || lanes+=("$lane")
        in_lane[$lane]+="$scenario"$'\n'
    done
    ((${#lanes[@]})) && log "lanes side by side: ${lanes[*]}"
    for lane in "${lanes[@]}"; do
        mapfile -t lane_scenarios < <(printf '%s' "${in_lane[$lane]}")
        run_one_by_one "$results" "${lane_scenarios[@]}" &
        pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid" || true; done
    run_one_by_one "$results" "${alone[@]}"
    local passed failed skipped
    passed=$(grep -c '^PASS ' "$verdicts" || true)
    failed=$(grep -c '^FAIL ' "$verdicts" || true)
    skipped=$(grep -c '^SKIP ' "$verdicts" || true)
    echo "$passed passed, $failed failed, $skipped skipped"
    ((failed == 0)) || { log "failed: $(grep '^FAIL ' "$verdicts" | cut -d' ' -f2 | tr '\n' ' ')"; return 1; }
}

# scenario_lane FILE: the lane its `# e2e-lane: NAME` line names; none with E2E_LANES=off.
scenario_lane() {
    [[ ${E2E_LANES:-on} == off ]] && return 0
    sed -n 's/^# e2e-lane: *\([a-z0-9_-]*\) *$/\1/p' "$1" | head -n 1
}

# run_one_by_one RESULTS SCENARIO...: each in turn, its verdict a line of RESULTS/.verdicts
# (whole lines appended: lanes write there side by side).
run_one_by_one() {
    local results=$1
    shift
    local scenario name limit left start took rc report
    local deadline=${E2E_RUN_DEADLINE:-0} reserve=${E2E_SCENARIO_RESERVE:-480}
    # A timed-out scenario gets this long for its cleanup before it is killed.
    local grace=60
    for scenario in "$@"; do
        name=$(basename "$scenario" .sh)
        limit=${E2E_SCENARIO_TIMEOUT:-900}
        if ((deadline)); then
            left=$((deadline - $(date +%s)))
            if ((left < reserve)); then
                echo "SKIP $name" >>"$results/.verdicts"
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
        # Said in one write, so that lanes running side by side do not interleave a report.
        case $rc in
            0) echo "PASS $name" >>"$results/.verdicts"
               report=$(log "PASS $name (${took}s)" 2>&1
                   # What it measured, into the summary (the logs go with the cluster).
                   grep -h 'measured:' "$results/$name.log" | sed 's/^/    /' || true) ;;
            77) echo "SKIP $name" >>"$results/.verdicts"
                report=$(log "SKIP $name (${took}s): $(grep -m1 'SKIP:' "$results/$name.log" | sed 's/.*SKIP: //')" 2>&1) ;;
            *) echo "FAIL $name" >>"$results/.verdicts"
               # Why first: the last steps and every FAIL line (the state dumped at failure
               # pushes them out of the tail, and CI keeps only this summary).
               report=$(log "FAIL $name (${took}s), $(exit_reason "$rc" "$limit"); why, from $results/$name.log:" 2>&1
                   grep -E '\[e2e\] -- ' "$results/$name.log" | tail -3 | sed 's/^/    /'
                   grep -E '\[e2e\] FAIL: ' "$results/$name.log" | head -5 | sed 's/^/    /'
                   echo "    last lines:"
                   tail -25 "$results/$name.log" | sed 's/^/    /') ;;
        esac
        printf '%s\n' "$report" >&2
    done
}

exit_reason() {
    case $1 in
        124) echo "cut after its limit of $2 s" ;;
        137) echo "killed after its limit of $2 s (its cleanup did not end in time)" ;;
        unsettled) echo "not run: the cluster did not settle before it" ;;
        *) echo "exit $1" ;;
    esac
}
