# Sourced by scripts/test: how many pytest-xdist workers to run the suite on, in
# $workers (OPLOOP_TEST_WORKERS if set), with a line on stderr saying why.
#
# The suite mostly waits on real processes (hosts starting, sandboxes, timers), so on a
# quiet machine two workers a core more than halve its time. But a host's start-up is
# bursts of CPU (8 processes importing), and where others keep the cores busy, every
# worker more stretches every test's waits: beside two busy loops and other people's
# work (load 14-27 on 2 cores) 4 workers took 39 min with 32 waits past their bounds.
# So: two workers per core the others leave free, plus one, at least 2, at most 2 a core.
# "The others": the 1-minute load average, or the processes runnable now (sampled over
# a second) if more, since an average lags a load that has just begun. Right after
# this script's own set-up (a fresh clone: pip, apt), the average is mostly that set-up,
# not others': the processes runnable now say what the others do (a quiet machine read
# 1.4 so, and ran the suite on 2 workers in 10.9 min, against 8.1 min on 4).
cores=$(nproc)
runnable=$(for _ in 1 2 3 4 5 6 7 8 9 10; do
             awk '/^procs_running/ {print $2}' /proc/stat; sleep 0.1
           done | awk '{n += $1 - 1} END {printf "%.1f", n / NR}')  # less awk itself
average=$(cut -d' ' -f1 /proc/loadavg)
counted=$average
if [ -n "${just_installed:-}" ]; then
  counted=0; average="$average (ours: the set-up just now, not counted)"
fi
if [ -n "${OPLOOP_TEST_WORKERS:-}" ]; then
  workers=$OPLOOP_TEST_WORKERS
  echo "scripts/test: $workers workers (OPLOOP_TEST_WORKERS)" >&2
else
  workers=$(awk -v c="$cores" -v a="$counted" -v r="$runnable" 'BEGIN {
    others = (a > r) ? a : r; free = c - others; if (free < 0) free = 0
    w = int(2 * free + 1.5); if (w < 2) w = 2; if (w > 2 * c) w = 2 * c; print w }')
  echo "scripts/test: $workers workers ($cores cores; load of others: 1-min average" \
       "$average, runnable now $runnable; OPLOOP_TEST_WORKERS=N to choose)" >&2
fi
