"""HAMi, modelled from its source (Project-HAMi/HAMi at 4707fb02, v2.10.0): the node register
annotation (:mod:`~fracpilot_libs.hami.register`) and the scheduler's per-GPU fit rules
(:mod:`~fracpilot_libs.hami.fit`). Pure; nothing is re-exported here."""
