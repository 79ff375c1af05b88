"""A database password is never printed, in any form libpq accepts (URL userinfo, ``?password=``, a
key/value DSN): not in connection errors, `db status`, the config stored in ``runs.config`` or
MLflow's params."""

from __future__ import annotations

import sys

import pytest

from reflexdb import DatabaseUnavailable, ReflexdbError, Store
from reflexdb.config import parse_config
from reflexdb.settings import mask_url, normalize_url, scrub

REFLEXDB = [sys.executable, "-m", "reflexdb.cli.main"]
SECRET = "s3cret"
#: the same unreachable server, its password written every way libpq takes one
FORMS = {
    "userinfo": f"postgresql://alice:{SECRET}@127.0.0.1:1/nowhere",
    "driver tag": f"postgresql+psycopg://alice:{SECRET}@127.0.0.1:1/nowhere",
    "query": f"postgresql://alice@127.0.0.1:1/nowhere?password={SECRET}",
    "query, not first": f"postgresql://alice@127.0.0.1:1/nowhere?sslmode=disable&password={SECRET}",
    "query, upper case": f"postgresql://alice@127.0.0.1:1/nowhere?PASSWORD={SECRET}",
    "both": f"postgresql://alice:{SECRET}@127.0.0.1:1/nowhere?password={SECRET}",
    "unencoded @ in the password": f"postgresql://alice:{SECRET}@x@127.0.0.1:1/nowhere",
    "dsn": f"host=127.0.0.1 port=1 user=alice password={SECRET} dbname=nowhere",
    "dsn, quoted with a space": f"host=127.0.0.1 port=1 user=alice password='{SECRET} x' dbname=nowhere",
    "dsn, spaced": f"host=127.0.0.1 port=1 password = {SECRET} dbname=nowhere",
}


@pytest.mark.parametrize("form", FORMS)
def test_mask_hides_every_form(form):
    masked = mask_url(FORMS[form])
    assert SECRET not in masked and "***" in masked
    assert "127.0.0.1" in masked  # still says where


@pytest.mark.parametrize("form", FORMS)
def test_connection_error_names_the_server_not_the_password(form):
    with pytest.raises(DatabaseUnavailable) as err:
        Store.open(FORMS[form])
    msg = str(err.value)
    assert "cannot connect to PostgreSQL at" in msg and "127.0.0.1" in msg
    assert SECRET not in msg


@pytest.mark.parametrize("form", FORMS)
def test_stored_and_logged_config_is_masked(form):
    # cfg.masked() is what goes into runs.config and MLflow's params
    masked = parse_config({"run": "r", "database_url": FORMS[form]}).masked()
    assert SECRET not in str(masked)


def test_a_malformed_dsn_is_refused_without_its_password():
    # libpq's parse error quotes the DSN's own words back ('missing "=" after "junk"')
    with pytest.raises(ReflexdbError, match='not a database URL or DSN: .*missing "=" after "junk"') as err:
        normalize_url(f"host=h password={SECRET} junk")
    assert SECRET not in str(err.value)
    with pytest.raises(ReflexdbError, match="port 'x' is not a number"):
        normalize_url("host=h port=x")


def test_scrub_removes_the_password_from_a_message():
    assert scrub(f'bad "{SECRET}" here', FORMS["userinfo"]) == 'bad "***" here'
    assert scrub(f"at {SECRET} x!", FORMS["dsn, quoted with a space"]) == "at ***!"  # the quoted value,
    assert scrub(f'near "{SECRET}"', FORMS["dsn, quoted with a space"]) == 'near "***"'  # its words, and
    assert scrub(f"at {SECRET}", FORMS["dsn"]) == "at ***"
