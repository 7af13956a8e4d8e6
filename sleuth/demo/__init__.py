"""The main job on the embedded default: ``sleuth demo`` (:mod:`~sleuth.demo.cli`) runs
:func:`~sleuth.demo.run.run_demo` and writes its report (:mod:`~sleuth.demo.report`)."""
