"""MIG profile recommendations, pure: the profile tables of MIG-capable cards
(:mod:`~fracpilot_libs.mig.profiles`), the smallest profile that fits a workload's memory and
compute need (:mod:`~fracpilot_libs.mig.recommend`), a layout that packs the recommended
profiles onto GPUs under MIG's placement rules (:mod:`~fracpilot_libs.mig.layout`) and the
mig-parted configuration that would create it (:mod:`~fracpilot_libs.mig.mig_parted`).

Recommendations only: nothing here changes a GPU. The input is a small type of this package's
own (:class:`~fracpilot_libs.mig.recommend.MigNeed`: memory bytes and a compute share), so the
decision engine can change without this package knowing. No I/O, no clock.
"""
