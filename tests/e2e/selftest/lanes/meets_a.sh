# In lane a: passes only if lane b's scenario runs at the same time (meet.bash).
# e2e-lane: a
ME=a OTHER=b
source "$(dirname "$0")/meet.bash"
