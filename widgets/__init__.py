"""kvscope.widgets (the top-level ``widgets/`` folder): the live dashboard, its panels, and the pages made from
finished runs (report, comparison, sweep). Widgets draw anything shaped like a run (``panels.report_parts.
RecordedRun``); they read telemetry records and never import the engine, the models, the runs or the faces."""
