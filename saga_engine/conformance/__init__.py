"""A protocol conformance suite for participants in any language (``saga conformance``).

It talks to a running participant only through Kafka, as an engine would: it sends
commands and hostile records to ``{prefix}.cmd.{participant}`` and judges the replies on
the inbox and the records on the dead-letter topic against ``proto/PROTOCOL.md``: the
checks of section 7.5 in their order, the reply headers of 7.4, deduplication by command
id, every batch compression codec, the last of duplicate headers, commands without
optional headers, 64-bit integers, a reply topic that does not exist yet, and a
compensation for a forward step never applied. Section 16 maps each MUST of the protocol
to its case (:data:`CASE_NAMES`, the report's rows on every run). Each run tags its
records with its own id, so runs against one participant never mix. It never reads the
participant's code or database; the
participant under test implements the three command types of the protocol's section 16
(``ConformanceApply``, ``ConformanceRefuse``, ``ConformanceUndo``), whose replies say how
often an effect was applied.

Layer: beside ``client`` (it is a client of the protocol); may import ``kernel`` and
``transport`` and aiokafka, nothing above.
"""

from saga_engine.conformance._suite import CASE_NAMES, CaseResult, Report, run_suite

__all__ = ["CASE_NAMES", "CaseResult", "Report", "run_suite"]
