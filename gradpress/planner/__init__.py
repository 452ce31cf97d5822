"""The compression planner (Espresso's per-tensor decisions, MergeComp's fusion): profiles
measured in the running job (``profile.py``, ``calibrate.py``), a timeline simulator
(``simulate.py``), the decision (``decide.py``)."""
