"""`changelake demo`: the whole pipeline, shown end to end on generated data, checked.

Four parts, each a module: `protocol` (a mangled CDCv2 log decoded exactly, pure Python),
`pipeline` (a Debezium changefeed through CDCv2 and an at-least-once log into a lake table, on
Spark), `postgres` (an embedded PostgreSQL captured into lake tables while a workload runs, the
capture killed once and restarted, every table and the cross-table invariant checked) and
`debezium` (beside that capture, on the same workload, real Debezium writing to a real Kafka
broker, killed once and restarted, its topics ingested into lake tables that must equal the
database's and the capture's tables). Any mismatch is a non-zero exit of the command.
"""

from changelake.demo.pipeline import PipelineResult, PipelineStep, run_pipeline_demo
from changelake.demo.protocol import DemoResult, run_protocol_demo

__all__ = ["DemoResult", "PipelineResult", "PipelineStep", "run_pipeline_demo",
           "run_protocol_demo"]
