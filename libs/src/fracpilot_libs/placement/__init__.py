"""GPU placement, pure: which workload holds how much of which GPU, and the planner that
places a new fraction (in place, elsewhere by best fit, or after a scale-up).

The actuator executes its plans; ``fracpilot replay --pack`` replays decisions through the
same planner. No I/O (an import-linter contract). Nothing is re-exported here.
"""
