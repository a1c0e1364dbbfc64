"""The faithfulness judge, harness side (docs/judge.md): the workspace snapshot, the judge's own
gateway and client, the judge step of a run, the labelled set and ``ale judge``. The pure parts
(the rubric, the judge input, the verdict) are in :mod:`ale.core`."""
