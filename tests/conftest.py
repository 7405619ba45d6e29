"""Shared fixtures. One SparkSession per test run (Spark start-up costs ~10 s)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

# The format of a table a test makes without naming one. The product's default is Delta Lake
# (`lake/table.py`); the default run makes Hive-format tables, whose commits cost a Delta
# commit's fraction, to stay within its time, and covers Delta by the tests that name it
# (`test_lake_delta.py`, `test_cli_lake_delta.py`, the writers race, kill -9, SQL AS OF,
# TRUNCATE). `.ci/slow` runs the lake tests again with CHANGELAKE_TABLE_FORMAT=delta: each
# lake test passes on both formats. Set the variable to run the default run on either.
#
# Where the lake tests make their lakes (`lake_root`, `tests/support/lake_roots.py`): local
# directories, or with CHANGELAKE_TEST_LAKE=s3 prefixes on one moto S3 server for the run, whose
# tables are then Delta tables (the product's default) unless CHANGELAKE_TABLE_FORMAT=hive says
# otherwise. `.ci/slow` runs the lake tests again that way, in both formats; the default run
# makes no S3 lake there.
from tests.support.lake_roots import LakeRoots, on_s3

os.environ.setdefault("CHANGELAKE_TABLE_FORMAT", "delta" if on_s3() else "hive")

# Every random test is seeded and says its seed. Hypothesis: derandomized (its generator is
# seeded from each test's name and source), so a run is repeatable; a failure prints the
# falsifying example, seeds drawn for `random.Random` included. Plain
# `random`: `support.seeding.seeded`. No deadline: an example's time is the machine's load,
# not a property of the code (no timing assertions in unit tests).
settings.register_profile("changelake", derandomize=True, print_blob=True, deadline=None)
settings.load_profile("changelake")


def pytest_report_header() -> str:
    return "hypothesis: derandomized (profile changelake); random tests print their seed"

#: Parametrized tests whose first cases cover their edge in the default run: the slow tier
#: (`pytest -m slow`) runs the rest. Each case is a Spark conversion (often the Python path's
#: too) or a CLI process of its own, seconds each; the default run must stay within 20 minutes
#: on 2 cores. Test (file::function) -> the number of its cases the default run keeps.
DEFAULT_CASES = {
    # real Debezium's records: the closed conversion in the default run, the open one slow
    "test_debezium_real_samples.py::"
    "test_a_keyed_table_of_many_types_converts_on_spark_as_the_encoder_does": 1,
    "test_spark_changefeed_debezium.py::test_json_orjson_refuses_is_refused_at_its_line": 1,
    "test_spark_changefeed_debezium.py::"
    "test_source_keys_only_an_exact_reading_finds_agree_with_the_encoder": 1,
    "test_spark_changefeed_debezium.py::test_a_line_out_of_bounds_is_named_as_the_encoder_names_it":
        1,
    "test_spark_changefeed_debezium.py::"
    "test_a_snapshot_flag_of_any_json_kind_converts_or_is_refused_as_the_encoder_does": 1,
    "test_spark_changefeed_debezium.py::test_an_image_written_as_a_json_string_is_refused_at_its_line":
        1,
    "test_spark_changefeed_debezium.py::"
    "test_a_table_name_of_another_json_kind_is_read_as_the_encoder_reads_it": 1,
    "test_spark_changefeed_debezium.py::test_pg_history_matches_the_encoder": 1,
    "test_spark_changefeed_debezium.py::"
    "test_a_sequence_in_another_shape_converts_as_the_encoder_reads_it": 1,
    "test_spark_changefeed_debezium.py::"
    "test_a_gtid_of_another_json_kind_converts_as_the_encoder_reads_it": 1,
    "test_spark_changefeed_debezium.py::"
    "test_a_binlog_number_spark_cannot_cast_converts_as_the_encoder_does": 1,
    "test_spark_changefeed_debezium.py::"
    "test_a_column_of_two_json_kinds_is_refused_at_its_line_not_read_as_text": 1,
    "test_spark_changefeed_debezium.py::"
    "test_numbers_at_the_edges_convert_as_the_encoder_converts_them": 1,
    "test_spark_changefeed_debezium.py::"
    "test_a_write_at_a_position_its_key_has_passed_is_no_tie": 1,
    "test_spark_changefeed_jvm.py::test_a_field_of_another_kind_reads_the_same": 3,
    "test_spark_changefeed_ydb.py::test_two_rows_for_one_key_at_one_position_go_to_the_python_path":
        1,
    "test_spark_changefeed_ydb.py::test_a_record_below_a_barrier_is_a_replay_only_if_it_repeats_one":
        2,
    "test_spark_changefeed_ydb.py::test_two_partitions_with_barriers_and_a_restart": 1,
    "test_spark_changefeed_ydb.py::test_a_record_below_a_barrier_outside_the_converted_times": 2,
    "test_spark_changefeed_barriers.py::test_the_scan_finds_what_the_window_finds": 2,
    "test_spark_changefeed_times.py::test_untimed_changes_take_the_highest_earlier_time": 2,
    "test_spark_changefeeds.py::test_debezium_on_spark_matches_the_encoder": 1,
    "test_spark_changefeeds_state.py::"
    "test_state_on_spark_matches_the_encoder_with_a_memory_state": 1,
    "test_convert_spark_rules.py::test_spark_times_are_the_encoders": 1,
    "test_lake_follow.py::test_follow_equals_one_shot_ingest": 1,
    "test_lake_kafka_changefeed.py::"
    "test_a_replayed_tail_after_a_cut_transaction_lets_the_frontier_advance": 1,
    "test_lake_arrow_read.py::test_arrow_and_spark_read_the_same_rows": 1,
    "test_lake_ingest.py::"
    "test_a_value_spark_refuses_in_the_commits_write_goes_to_the_python_path": 1,
    # The name rules are checked in-process on every bad name (test_parse_refuses, the API
    # test); the CLI's own processes need only show that it asks them first.
    "test_lake_names.py::test_cli_refuses_a_bad_table_name_before_anything_is_created": 5,
    "test_lake_names.py::test_cli_refuses_a_bad_key_column": 2,
    # Delta tables: the keyed case in the default run, the unkeyed one (its MERGE is also
    # run by test_every_reader_sees_the_rows...[unkeyed]) in the slow tier; a TRUNCATE on
    # the Hive format in the default run, on Delta in the slow tier.
    "test_lake_delta.py::test_compaction_folds_history_and_keeps_every_later_time_exact": 1,
    "test_capture_pg_truncate.py::test_a_truncate_empties_the_lake_table_by_a_spark_job": 1,
    # One refused ALTER, one added column, two refused log changes in the default run.
    "test_capture_pg_ddl.py::test_a_change_a_lake_table_cannot_follow_is_refused": 1,
    "test_capture_pg_ddl.py::test_a_column_added_while_the_capture_runs": 1,
    "test_capture_pg_ddl.py::test_a_change_of_a_logs_columns_is_refused": 2,
    "test_capture_pg_ddl.py::test_a_change_of_a_logs_columns_while_it_runs_is_refused": 2,
    # The default run was over its 20 minutes (2026-12-03): one case each here, the rest in
    # the slow tier.
    "test_lake_delta.py::test_every_reader_sees_the_rows_and_as_of_is_exact_at_every_time": 1,
    "test_lake_names.py::test_cli_read_and_compact_refuse_bad_names_too": 1,
}

#: Whole tests the default run leaves to the slow tier: each a CLI process (or several) of
#: 15-30 s whose rule a faster in-process test of the default run also checks.
SLOW_TESTS = {
    # real Debezium and a real broker, then a Spark ingest per table (minutes): the Spark path's
    # reading of what real Debezium writes is test_debezium_real_samples.py's, in the default run
    "test_debezium_pipeline.py::"
    "test_real_debezium_killed_and_restarted_into_the_lake_equals_the_database",
    # ALTER TABLE under real Debezium (minutes): test_debezium_alter.py's generated feeds on
    # both paths and into the lake in the default run
    # the Kafka ALTER run (a topic, two ingests and a refusal: 25 s): the same rule on files
    # through both paths and the lake is test_debezium_alter.py's other tests
    "test_debezium_alter.py::test_kafka_ingest_follows_the_alter_then_refuses_a_kind_change",
    "test_debezium_alter_pipeline.py::"
    "test_real_debezium_alter_table_add_and_drop_column_into_the_lake",
    # the freshness benchmark's core at 20 tx/s (real Debezium, a broker, `ingest --follow`
    # as a process stopped by SIGINT; minutes): the same reading of real Debezium's records is
    # test_debezium_real_samples.py's, the SIGINT stop test_follow_signals.py's
    "test_debezium_freshness.py::"
    "test_debezium_pipeline_at_a_tiny_rate_lands_the_database_in_the_lake",
    # the archive a command maps: test_the_setups_archive_is_mapped_by_a_commands_jvm
    "test_class_archive.py::"
    "test_a_failing_training_run_leaves_the_archive_there_was_and_nothing_else",
    # the key rule's message: the in-process tests of test_lake_key_rule.py (a timestamp
    # key's text in another time zone only here)
    "test_lake_key_rule.py::test_the_command_line_says_it_in_one_line_with_the_keys_text",
    # the busy metastore: test_a_process_that_stopped_its_session_opens_the_lake_again
    "test_lake_metastore_busy.py::"
    "test_a_second_process_on_the_embedded_metastore_is_told_what_to_do",
    # Delta compaction: test_compaction_folds_history_and_keeps_every_later_time_exact
    "test_lake_delta.py::test_compaction_folds_only_once_the_changes_reach_a_fraction_of_the_base",
    # the reserved columns: the in-process tests of test_lake_reserved_columns.py
    "test_lake_reserved_columns.py::test_ingest_of_a_cdc_log_with_a_time_column_is_one_line",
    # follow on S3 (two minutes on CI): the slow tier's kill seeds compare the same tables;
    # follow itself: test_lake_follow.py, and the S3 lake: test_lake_s3.py's ingest
    "test_lake_s3_follow.py::test_follow_into_an_s3_lake_equals_one_shot_ingest",
    # the private JVM log removed after a command: test_the_jvm_log_is_private_and_a_planted_
    # link_refused (its creation) and the sweep of old logs in the default run
    "test_private_files.py::test_a_command_that_succeeds_removes_its_jvm_log",
    # an S3 store's errors: test_missing_credentials_are_one_line in the default run
    "test_lake_s3.py::test_a_bucket_that_does_not_exist_is_one_line",
    "test_lake_s3.py::test_a_store_that_cannot_be_reached_is_one_line",
    # odd lake and input paths through a JVM's options: the name rules in-process
    "test_lake_names.py::test_cli_runs_on_a_lake_and_an_input_under_odd_paths",
    # a broker killed under a Spark ingest (a minute and more): the broker's own restart,
    # test_the_broker_keeps_records_across_a_clean_and_a_killed_restart, in the default run
    "test_kafka_broker_reads.py::"
    "test_a_broker_restart_during_an_ingest_loses_and_doubles_nothing",
    # a lake ingest through SASL (most of a minute): the executors' read with the settings,
    # test_a_kafka_cdc_read_on_the_executors_takes_the_settings, in the default run
    "test_kafka_security.py::test_ingest_reads_on_the_executors_with_the_settings",
    "test_kafka_security.py::test_a_follow_reads_through_sasl",
    # The default run was over its 20 minutes (2026-12-03, 27 min on CI's 2 cores): each of
    # these is a CLI process or a Spark edge case whose rule a default test also checks.
    # The S3 lake's ingest, snapshot and status: an ingest on S3 in
    # test_a_second_writer_is_refused_by_the_lock_object, every command in the slow tier
    "test_lake_s3.py::test_ingest_snapshot_and_status_on_s3",
    # every reader of a Delta table: in-process in test_lake_delta.py's every_reader test
    "test_cli_lake_delta.py::test_a_delta_table_every_reader_reads",
    # the unkeyed table's mangled increments: the keyed case in the default run
    "test_lake_table.py::test_unkeyed_mangled_increments_with_compactions",
    # the name rules through a CLI process: in-process in test_lake_names.py
    "test_lake_names.py::test_names_are_case_insensitive_one_table_one_directory",
    "test_lake_names.py::test_a_lake_root_with_a_quote_and_spaces_works",
    # follow on topics: test_lake_follow.py (files) and the Kafka ingest tests
    "test_lake_follow_kafka.py::"
    "test_follow_topics_commits_each_batch_once_and_status_shows_the_lag",
    # the change feed's driver memory: test_lake_changes.py's other tests read changes
    "test_lake_changes.py::test_changes_of_many_times_hold_no_collection_of_them_in_the_driver",
    # the class archive mapped by a command: a start-up speed, not a result
    "test_class_archive.py::test_the_setups_archive_is_mapped_by_a_commands_jvm",
    # edges of the Python path on Spark: the encoder's differential tests in the default run
    "test_spark_changefeed_debezium.py::test_a_bad_line_goes_to_the_python_path_with_its_error",
    "test_spark_changefeed_debezium.py::test_two_rows_for_one_key_at_one_position_go_to_the_python_path",
    "test_spark_changefeed_debezium.py::"
    "test_without_keys_a_missing_before_image_is_the_encoders_error",
    "test_spark_changefeed_debezium.py::test_columns_that_differ_only_in_case_are_the_encoders_rows",
    "test_spark_changefeed_ydb.py::test_a_late_record_is_named_by_the_python_path",
    # Spark's Kafka connector against kafka-cdc, four and two lake ingests (1.5 minutes,
    # 80 s), and its SASL read (25 s): its offsets, data loss and read-committed and the
    # settings' translation in the default run (test_spark_kafka_connector.py)
    "test_spark_kafka_connector.py::test_materialize_topics_make_the_table_kafka_cdc_makes",
    "test_spark_kafka_connector.py::test_debezium_topics_make_the_table_kafka_cdc_makes",
    "test_spark_kafka_connector.py::"
    "test_sasl_settings_reach_the_connector_and_are_never_shown",
    # a real Maven build of the jar (15-40 s): the install builds it, with its JUnit tests,
    # and test_a_current_packaged_jar_is_taken_without_maven_or_a_jdk is in the default run
    "test_spark_jvm_jar.py::test_a_stale_jar_is_built_by_maven_once_and_then_taken",
    # a failed Maven build through the CLI: in-process in
    # test_a_failed_build_is_one_error_with_mavens_first_error
    "test_spark_jvm_jar.py::test_a_failed_build_is_one_error_line_from_the_command_line",
    # two real Maven builds at once: the rename into place is the same as one build's
    "test_spark_jvm_jar.py::test_processes_building_at_once_each_get_the_one_jar",
    # The default run was at its 20 minutes again (2026-12-03, 1,201 s on 2 cores). Each of
    # these has a faster default test of the same rule:
    # the follower's checkpoints: test_commits_leave_current_to_the_follower_which_catches_up...
    "test_lake_current_follower.py::"
    "test_updates_is_checkpointed_every_few_versions_off_the_commit",
    # a replayed tail on the Python path (now a rare fallback): on the Spark path in
    # test_lake_kafka_changefeed.py's test_a_replayed_tail_after_a_cut_transaction_...
    "test_lake_ingest.py::test_a_replayed_tail_lets_the_frontier_advance_on_the_python_path",
    # a restarted kafka-cdc stream over deleted records: the same rule on Spark's connector in
    # test_spark_kafka_connector.py's test_deleted_records_fail_the_read_unless_...
    "test_spark_kafka_data_loss.py::test_a_restarted_stream_fails_on_deleted_records_or_skips_them",
    # a second S3 writer: the lock object's conditional PUT in
    # test_the_lock_object_is_made_by_a_conditional_put
    "test_lake_s3.py::test_a_second_writer_is_refused_by_the_lock_object",
    # missing S3 credentials: the same one-line StoreError in
    # test_a_bucket_that_does_not_exist_is_one_line and test_a_store_that_cannot_be_reached...
    "test_lake_s3.py::test_missing_credentials_are_one_line",
    # a column the table lacks, also on the Python path: the Spark path's in
    # test_state_on_spark_matches_the_encoder_with_a_memory_state
    "test_spark_changefeeds_state.py::"
    "test_a_column_the_table_lacks_is_null_in_its_rows_on_both_paths",
    # the requests a commit makes: benchmarks/bench_s3.py measures them per commit
    "test_lake_delta.py::test_a_writer_reads_previous_rows_from_current_not_every_update",
}


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the cases of `DEFAULT_CASES` beyond each test's first ones, and `SLOW_TESTS`,
    `slow`."""
    seen: dict[str, int] = {}
    for item in items:
        name = f"{item.path.name}::{getattr(item, 'originalname', item.name)}"
        if name in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
        if name in DEFAULT_CASES:
            seen[name] = seen.get(name, 0) + 1
            if seen[name] > DEFAULT_CASES[name]:
                item.add_marker(pytest.mark.slow)




@pytest.fixture(scope="session")
def lake_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """With CHANGELAKE_TEST_LAKE=s3, the run's S3 server (`s3_server.S3Server`), else None.

    Its key pair, endpoint and region go into this process's environment as the AWS SDK's
    variables (the machine's own AWS_* left out), the way a user gives them to a command: the
    SparkSession's S3A settings (`files.object_store_conf`) and every CLI process a test
    starts take them from there. The remote lakes' local metastores go under the run's
    temporary root (`CHANGELAKE_STATE_HOME`). Stopped, and the environment restored, at the
    end of the run."""
    if not on_s3():
        yield None
        return
    from tests.support.s3_server import s3_server

    saved = dict(os.environ)
    with s3_server() as server:
        for name in [n for n in os.environ if n.startswith("AWS_")]:
            del os.environ[name]
        os.environ.update(server.environment())
        os.environ.setdefault("CHANGELAKE_STATE_HOME", str(tmp_path_factory.mktemp("state")))
        try:
            yield server
        finally:
            os.environ.clear()
            os.environ.update(saved)


@pytest.fixture
def lake_root(lake_at) -> Path | str:
    """The root of a test's lake: `tmp_path / "lake"`, or with CHANGELAKE_TEST_LAKE=s3 an
    `s3a://` prefix of its own on the run's S3 server."""
    return lake_at("lake")


@pytest.fixture
def lake_at(lake_store, tmp_path: Path, request: pytest.FixtureRequest) -> LakeRoots:
    """`lake_at(name)`: the root of another lake of the test, as `lake_root` makes it."""
    return LakeRoots(tmp_path, request.node.name, getattr(lake_store, "bucket", None))


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory, lake_store: object) -> Iterator[object]:
    """The one SparkSession of the test run, local[2], with an embedded Hive metastore and
    S3A on its classpath (with CHANGELAKE_TEST_LAKE=s3, its settings from the environment)."""
    from changelake.lake.files import object_store_conf
    from changelake.spark.session import build_session

    root = tmp_path_factory.mktemp("spark")
    conf = {"spark.sql.shuffle.partitions": "4"}
    session = build_session(
        "local[2]",
        app_name="changelake-tests",
        hive_metastore_dir=root / "metastore",
        warehouse_dir=root / "warehouse",
        conf=object_store_conf(conf) if lake_store is not None else conf,
        object_store=True,  # S3A on the classpath: test_lake_s3.py's in-process commands
    )
    yield session
    session.stop()


@pytest.fixture(scope="session")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """One embedded PostgreSQL server (wal_level = logical) for the test run.

    Its folder is not under pytest's temporary root: that is private to us (mode 700), and
    when the tests run as root the server runs as an unprivileged account that must reach it.
    """
    import shutil
    import tempfile

    from changelake.capture.postgres.server import EmbeddedPostgres

    root = Path(tempfile.mkdtemp(prefix="changelake-test-pg-"))
    server = EmbeddedPostgres(root).start()
    yield server
    server.stop()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pg_dsn(postgres: object, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh database of the embedded server for one test; its slots go with it."""
    import re
    import time

    import psycopg2

    name = "t_" + re.sub(r"\W", "_", request.node.name.lower())[:50]
    admin = psycopg2.connect(postgres.dsn)  # type: ignore[attr-defined]
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        cur.execute(f'CREATE DATABASE "{name}"')
    yield postgres.dsn_for(name)  # type: ignore[attr-defined]
    with admin.cursor() as cur:
        # A walsender outlives its client by a moment: wait for its slot to be released.
        for _ in range(200):
            cur.execute("SELECT count(*) FROM pg_replication_slots WHERE database = %s AND "
                        "active", (name,))
            if not cur.fetchone()[0]:
                break
            time.sleep(0.05)
        cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                    "WHERE database = %s AND NOT active", (name,))
        cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.close()


@pytest.fixture
def no_public_views(spark) -> Iterator[None]:
    """Captured tables are named after their PostgreSQL schema (`public.*`) and the test run
    shares one metastore, so another test's lake may have left a `public.accounts`: drop the
    views under `public` (and the external tables of Delta lake tables), before and after
    (their lakes are temporary directories)."""

    def drop() -> None:
        if spark.catalog.databaseExists("public"):
            for table in spark.catalog.listTables("public"):
                if not table.isTemporary:
                    kind = "VIEW" if table.tableType == "VIEW" else "TABLE"
                    spark.sql(f"DROP {kind} IF EXISTS `public`.`{table.name}`")

    drop()
    yield
    drop()


@pytest.fixture(scope="session")
def broker_server() -> Iterator[object]:
    """One Apache Kafka broker (KRaft, one node) for the test run, on 127.0.0.1
    (`changelake.kafka.broker`): tests share it through `broker`, each with topics of its own
    (`kafka_helpers.new_topic`). It has a SASL/PLAIN listener too (`sasl_bootstrap`), with one
    user, `kafka_helpers.SASL_USER`, whose password is made for the run. Killed at the end of
    the run, or with the test process."""
    from changelake.kafka.broker import KafkaBroker
    from tests.support.kafka_helpers import SASL_PASSWORD, SASL_USER

    with KafkaBroker(sasl_users={SASL_USER: SASL_PASSWORD}, die_with_parent=True) as running:
        yield running


@pytest.fixture
def broker(broker_server: object) -> object:
    """The run's broker, running: started again if a test before stopped or killed it (and
    failed before starting it again)."""
    return broker_server.start()  # type: ignore[attr-defined]
