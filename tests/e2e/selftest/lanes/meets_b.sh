# In lane b: passes only if lane a's scenario runs at the same time (meet.bash).
# e2e-lane: b
ME=b OTHER=a
source "$(dirname "$0")/meet.bash"
