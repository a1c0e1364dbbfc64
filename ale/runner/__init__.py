"""The trusted harness: one Trio program that runs tasks and writes the submission bundle.

``ale.runner.cli`` is the ``ale`` command; ``harness`` drives a run; ``runtime`` is the interface
the embedded local runtime (``local``) and the OCI runtimes implement; ``recorder`` writes the
hash-chained trajectory; ``bundle_writer`` assembles the bundle.
"""
