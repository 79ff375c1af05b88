"""Each run's own folder under a checkpoint URL or directory, and the marker that says whose it is
(reflexdb/storage.py: run_key, run_prefix, claim, check_owner, remove_if_recorded; issue 60)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from reflexdb import storage

T0 = datetime(2026, 12, 1, 10, 0, 0, 123456, tzinfo=timezone.utc)


def test_each_run_has_a_folder_of_its_own_whatever_its_name():
    assert storage.run_prefix("s3://b/ckpt/", 7, "math-1") == "s3://b/ckpt/math-1.r7"
    assert storage.run_key(7, "math-1") != storage.run_key(9, "math-1")  # deleted and made again: another id
    assert storage.run_key(3, "../../etc") == "_.._etc.r3"  # no separator, no leading dot
    assert storage.run_key(4, "..") == "run.r4" and storage.run_key(5, "") == "run.r5"
    assert storage.run_key(6, "a b/c?d#e%f") == "a_b_c_d_e_f.r6"
    assert storage.run_key(8, "x" * 200) == "x" * 100 + ".r8"


def test_the_owner_is_the_same_instant_in_any_time_zone():
    a = storage.Owner.of("r", 1, T0)
    b = storage.Owner.of("r", 1, T0.astimezone(timezone(timedelta(hours=5))))
    assert a == b and str(a) == "run 'r' (id 1, created 2026-12-01T10:00:00.123456+00:00)"


def test_a_folder_is_claimed_once_and_refused_to_another_run(tmp_path):
    mine = storage.Owner.of("r", 1, T0)
    folder = tmp_path / "r.r1"
    assert storage.read_owner(str(folder), None) is None
    storage.claim(str(folder), None, mine)
    storage.claim(str(folder), None, mine)  # again: the same run
    assert storage.read_owner(str(folder), None) == mine
    storage.check_owner(str(folder), None, mine, "not deleting")
    other = storage.Owner.of("r", 1, T0 + timedelta(seconds=1))  # same name and id, another database
    with pytest.raises(storage.PrefixOwned, match=rf"{folder} belongs to run 'r' \(id 1, created "
                                                   r"2026-12-01T10:00:00.123456\+00:00\) \(reflexdb-run.json there\), "
                                                   r"not to run 'r' \(id 1, created 2026-12-01T10:00:01.123456"):
        storage.claim(str(folder), None, other)
    with pytest.raises(storage.PrefixOwned, match=r"holds the reflexdb-run.json of run 'r' .*: not pruning anything"):
        storage.check_owner(str(folder), None, other, "not pruning")
    with pytest.raises(storage.PrefixOwned, match=r"holds no reflexdb-run.json, not run 'r' .*'s: not deleting"):
        storage.check_owner(str(tmp_path / "elsewhere"), None, mine, "not deleting")


@pytest.mark.parametrize("body", [b"not json", b"[1, 2]", b'{"run": "r"}', b'{"run": "r", "run_id": "x", '
                                  b'"created_at": "t"}', b"\xff\xfe", b" " * 5000])
def test_a_marker_reflexdb_did_not_write_refuses_everything(tmp_path, body):
    (tmp_path / storage.OWNER_FILE).write_bytes(body)
    with pytest.raises(storage.PrefixOwned, match=r"reflexdb-run.json is not a marker reflexdb wrote \(.*\): nothing "
                                                   "is written or deleted there"):
        storage.claim(str(tmp_path), None, storage.Owner.of("r", 1, T0))


def test_an_upload_into_another_runs_prefix_is_refused_before_it_writes(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "model.safetensors").write_bytes(b"w" * 10)
    base = f"file://{tmp_path / 'shared' / 'r.r1'}"
    storage.upload(src, storage.version_uri(base, 0), None, limit_s=5, owner=storage.Owner.of("r", 1, T0))
    with pytest.raises(storage.PrefixOwned, match="refusing to publish there"):
        storage.upload(src, storage.version_uri(base, 0), None, limit_s=5, owner=storage.Owner.of("s", 2, T0))
    assert (tmp_path / "shared" / "r.r1" / "v0" / "manifest.json").exists()


def test_an_old_version_is_deleted_only_while_its_weights_are_the_recorded_ones(tmp_path):
    v = tmp_path / "v3"
    v.mkdir()
    (v / "model.safetensors").write_bytes(b"theirs now")
    assert not storage.remove_if_recorded(f"file://{v}", "0" * 64, None) and v.is_dir()
    assert not storage.remove_if_recorded(f"file://{v}", None, None) and v.is_dir()
    assert storage.remove_if_recorded(f"file://{v}", storage.weights_sha256(v), None) and not v.exists()
    assert not storage.remove_if_recorded(f"file://{v}", "0" * 64, None)  # gone already


def test_runs_delete_lends_only_storage_options_that_pass_the_secret_check():
    """A ``runs.config`` is the database's row: its storage options are checked again before
    ``runs delete`` reaches storage with them (an endpoint with a login, a secret key: none)."""
    from reflexdb.ops.published import _options

    def config(options):
        return {"learner": {"checkpoint_url": "s3://b/runs", "checkpoint_storage_options": options}}

    assert _options("s3://b/runs/x.r1/v1", config({"endpoint_url": "http://minio:9000"})) == {
        "endpoint_url": "http://minio:9000"}
    assert _options("s3://b/runs/x.r1/v1", config({"endpoint_url": "http://u:pw@evil:9000"})) == {}
    assert _options("s3://b/runs/x.r1/v1", config({"s3_additional_kwargs": {"SSECustomerKey": "k"}})) == {}
    assert _options("s3://b/runs/x.r1/v1", config("not a mapping")) == {}
