"""Workloads: what requests a run submits. ``items`` (``WorkItem``, seeded synthetic requests, prompt files,
arrivals), ``draws`` (``random.Random``'s draws in bulk), ``recorded`` (a recorded run's requests, for
``kvscope simulate --replay``)."""
