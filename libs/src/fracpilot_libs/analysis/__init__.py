"""Analysis over the sizing engine, pure: trace reading, replay, cost and overrun accounting,
the baselines it is measured against, hindsight, and packing (what fractions cost in cards).

Only the CLI (``replay``, ``report``, ``demo``) and the benches use it; the services never
import it (an import-linter contract), so it may grow without touching the live path.
Modules are imported one by one (nothing is re-exported here).
"""
