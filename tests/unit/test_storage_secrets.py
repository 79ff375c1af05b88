"""No credential in the config (issue 60, item 9): every storage option fsspec's S3 (s3fs), GCS
(gcsfs) and HTTP filesystems document, judged one by one — refused (a credential: it would be
stored in ``runs.config``, logged to MLflow and printed by ``reflexdb check``) or passed — and the
three that got past the old filter (``SSECustomerKey``, a proxy URL and an ``endpoint_url`` with
``user:pw@``), through ``reflexdb check``, the stored config and the MLflow params.

The rule (reflexdb/storage.py, ``check_options``): a name whose words (camelCase split) look like
a credential is refused unless its value is true/false/empty; a URL value with a user, a password
or a signed query, or an HTTP Authorization value, is refused under any name."""

from __future__ import annotations

import inspect

import pytest
from typer.testing import CliRunner

from reflexdb import storage
from reflexdb.cli.main import app
from reflexdb.config import ConfigError, parse_config

SECRET = "wJalrXUtnFEMI-s3cret"
REFUSED, PASSED = "refused", "passed"

#: (filesystem, dotted path under checkpoint_storage_options, value, verdict). A value that is a
#: Python object in the library (a session, a connector) is a string here: the name is judged.
S3 = [
    # s3fs.S3FileSystem.__init__
    ("anon", True, PASSED),
    ("endpoint_url", "http://127.0.0.1:9000", PASSED),
    ("endpoint_url", f"http://minio:{SECRET}@127.0.0.1:9000", REFUSED),
    ("endpoint_url", f"http://{SECRET}@127.0.0.1:9000", REFUSED),  # a user alone can be the token
    ("endpoint_url", f"https://s3.example.com/?X-Amz-Signature={SECRET}", REFUSED),
    ("key", "AKIAIOSFODNN7EXAMPLE", REFUSED),
    ("secret", SECRET, REFUSED),
    ("token", SECRET, REFUSED),
    ("use_ssl", False, PASSED),
    ("requester_pays", True, PASSED),
    ("default_block_size", 5 << 20, PASSED),
    ("default_fill_cache", False, PASSED),
    ("default_cache_type", "none", PASSED),
    ("version_aware", True, PASSED),
    ("session", SECRET, REFUSED),  # an aiobotocore session, which may carry credentials
    ("username", "AKIAIOSFODNN7EXAMPLE", REFUSED),  # s3fs: the same as key
    ("password", SECRET, REFUSED),  # s3fs: the same as secret
    ("cache_regions", True, PASSED),
    ("asynchronous", False, PASSED),
    ("loop", None, PASSED),
    ("max_concurrency", 4, PASSED),
    ("fixed_upload_size", True, PASSED),
    ("local_expiry_check", True, PASSED),
    ("profile", "training", PASSED),  # **kwargs: the aiobotocore session's
    # fsspec's AbstractFileSystem (every filesystem)
    ("use_listings_cache", False, PASSED),
    ("listings_expiry_time", 10, PASSED),
    ("max_paths", 100, PASSED),
    ("skip_instance_cache", True, PASSED),
    # client_kwargs: botocore.session.Session.create_client
    ("client_kwargs.region_name", "eu-west-1", PASSED),
    ("client_kwargs.api_version", "2006-03-01", PASSED),
    ("client_kwargs.use_ssl", True, PASSED),
    ("client_kwargs.verify", "/etc/ssl/certs/ca.pem", PASSED),
    ("client_kwargs.endpoint_url", "https://minio.example.com", PASSED),
    ("client_kwargs.endpoint_url", f"https://minio:{SECRET}@minio.example.com", REFUSED),
    ("client_kwargs.aws_access_key_id", "AKIAIOSFODNN7EXAMPLE", REFUSED),
    ("client_kwargs.aws_secret_access_key", SECRET, REFUSED),
    ("client_kwargs.aws_session_token", SECRET, REFUSED),
    ("client_kwargs.aws_account_id", "123456789012", PASSED),
    # config_kwargs: botocore.config.Config
    ("config_kwargs.account_id_endpoint_mode", "preferred", PASSED),
    ("config_kwargs.auth_scheme_preference", "sigv4,sigv4a", PASSED),
    ("config_kwargs.client_cert", "/etc/ssl/client.pem", PASSED),
    ("config_kwargs.client_context_params", {"disable_s3_express_session_auth": True}, PASSED),
    ("config_kwargs.connect_timeout", 5, PASSED),
    ("config_kwargs.defaults_mode", "standard", PASSED),
    ("config_kwargs.disable_request_compression", True, PASSED),
    ("config_kwargs.endpoint_discovery_enabled", True, PASSED),
    ("config_kwargs.ignore_configured_endpoint_urls", True, PASSED),
    ("config_kwargs.inject_host_prefix", False, PASSED),
    ("config_kwargs.max_pool_connections", 20, PASSED),
    ("config_kwargs.parameter_validation", False, PASSED),
    ("config_kwargs.proxies", {"https": "http://proxy.example.com:3128"}, PASSED),
    ("config_kwargs.proxies", {"https": f"http://bob:{SECRET}@proxy.example.com:3128"}, REFUSED),
    ("config_kwargs.proxies_config", {"proxy_ca_bundle": "/etc/ca.pem", "proxy_client_cert": "/etc/c.pem",
                                      "proxy_use_forwarding_for_https": True}, PASSED),
    ("config_kwargs.read_timeout", 30, PASSED),
    ("config_kwargs.region_name", "eu-west-1", PASSED),
    ("config_kwargs.request_checksum_calculation", "when_required", PASSED),
    ("config_kwargs.request_min_compression_size_bytes", 10240, PASSED),
    ("config_kwargs.response_checksum_validation", "when_required", PASSED),
    ("config_kwargs.retries", {"max_attempts": 3, "total_max_attempts": 4, "mode": "adaptive"}, PASSED),
    ("config_kwargs.s3", {"addressing_style": "path", "use_accelerate_endpoint": False,
                          "payload_signing_enabled": True, "us_east_1_regional_endpoint": "regional"}, PASSED),
    ("config_kwargs.s3_disable_express_session_auth", True, PASSED),  # a flag holds no secret
    ("config_kwargs.signature_version", "s3v4", PASSED),
    ("config_kwargs.sigv4a_signing_region_set", "*", PASSED),
    ("config_kwargs.tcp_keepalive", True, PASSED),
    ("config_kwargs.use_dualstack_endpoint", True, PASSED),
    ("config_kwargs.use_fips_endpoint", True, PASSED),
    ("config_kwargs.user_agent", "reflexdb", PASSED),
    ("config_kwargs.user_agent_appid", "reflexdb", PASSED),
    ("config_kwargs.user_agent_extra", "rl", PASSED),
    # s3_additional_kwargs: the S3 calls' parameters (s3fs keeps these across copies)
    ("s3_additional_kwargs.ServerSideEncryption", "aws:kms", PASSED),
    ("s3_additional_kwargs.SSEKMSKeyId", "arn:aws:kms:eu-west-1:123456789012:key/1234abcd", PASSED),
    ("s3_additional_kwargs.SSEKMSEncryptionContext", "eyJ0ZWFtIjoicmwifQ==", PASSED),
    ("s3_additional_kwargs.BucketKeyEnabled", True, PASSED),
    ("s3_additional_kwargs.SSECustomerAlgorithm", "AES256", PASSED),
    ("s3_additional_kwargs.SSECustomerKey", SECRET, REFUSED),
    ("s3_additional_kwargs.SSECustomerKeyMD5", SECRET, REFUSED),  # goes only with SSECustomerKey
    ("s3_additional_kwargs.sse_customer_key", SECRET, REFUSED),
    ("s3_additional_kwargs.ACL", "private", PASSED),
    ("s3_additional_kwargs.StorageClass", "STANDARD_IA", PASSED),
    ("s3_additional_kwargs.RequestPayer", "requester", PASSED),
    ("s3_additional_kwargs.ExpectedBucketOwner", "123456789012", PASSED),
    ("s3_additional_kwargs.ChecksumAlgorithm", "SHA256", PASSED),
    ("s3_additional_kwargs.CacheControl", "no-cache", PASSED),
    ("s3_additional_kwargs.ContentType", "application/octet-stream", PASSED),
    ("s3_additional_kwargs.Metadata", {"team": "rl", "note": "Basic run"}, PASSED),  # words, not an Authorization value
    ("s3_additional_kwargs.Tagging", "team=rl", PASSED),
    ("s3_additional_kwargs.ObjectLockMode", "GOVERNANCE", PASSED),
    ("s3_additional_kwargs.ObjectLockLegalHoldStatus", "OFF", PASSED),
    ("s3_additional_kwargs.GrantRead", 'id="79a59df900b949e55d96a1e698fbacedfd6e09d98eacf8f8d5218e7cd47ef2be"', PASSED),
]
GCS = [
    # gcsfs.GCSFileSystem.__init__ (gcsfs 2025.x, its docstring)
    ("project", "my-project", PASSED),
    ("access", "read_write", PASSED),
    ("token", "anon", REFUSED),  # the name alone: with no token gcsfs tries its sources, then anon
    ("token", {"client_email": "x@y.iam.gserviceaccount.com", "private_key": SECRET}, REFUSED),
    ("block_size", 5 << 20, PASSED),
    ("consistency", "md5", PASSED),
    ("cache_timeout", 60, PASSED),
    ("secure_serialize", True, PASSED),
    ("check_connection", False, PASSED),
    ("requests_timeout", 30, PASSED),
    ("requester_pays", "billing-project", PASSED),
    ("asynchronous", False, PASSED),
    ("session_kwargs", {"trust_env": True}, PASSED),
    ("session_kwargs", {"proxy": f"http://bob:{SECRET}@proxy.example.com:3128"}, REFUSED),
    ("session_kwargs", {"auth": ["bob", SECRET]}, REFUSED),
    ("session_kwargs", {"headers": {"Authorization": f"Bearer {SECRET}"}}, REFUSED),
    ("loop", None, PASSED),
    ("timeout", 60, PASSED),
    ("endpoint_url", "http://127.0.0.1:9023", PASSED),
    ("endpoint_url", f"http://bob:{SECRET}@127.0.0.1:9023", REFUSED),
    ("default_location", "EUROPE-WEST3", PASSED),
    ("version_aware", True, PASSED),
]
GCSFS_PARAMETERS = {"project", "access", "token", "block_size", "consistency", "cache_timeout", "secure_serialize",
                    "check_connection", "requests_timeout", "requester_pays", "asynchronous", "session_kwargs",
                    "loop", "timeout", "endpoint_url", "default_location", "version_aware"}
HTTP = [
    # fsspec.implementations.http.HTTPFileSystem.__init__
    ("simple_links", True, PASSED),
    ("block_size", 5 << 20, PASSED),
    ("same_scheme", True, PASSED),
    ("size_policy", "head", PASSED),
    ("cache_type", "bytes", PASSED),
    ("cache_options", {"maxblocks": 4}, PASSED),
    ("asynchronous", False, PASSED),
    ("loop", None, PASSED),
    ("get_client", None, PASSED),
    ("encoded", True, PASSED),
    ("storage_options", {"headers": {"Authorization": f"Basic {SECRET}"}}, REFUSED),
    # client_kwargs: aiohttp.ClientSession
    ("client_kwargs.base_url", "https://ckpt.example.com", PASSED),
    ("client_kwargs.base_url", f"https://{SECRET}@ckpt.example.com", REFUSED),
    ("client_kwargs.connector", "x", PASSED),
    ("client_kwargs.loop", None, PASSED),
    ("client_kwargs.cookies", {"session": SECRET}, REFUSED),
    ("client_kwargs.headers", {"User-Agent": "reflexdb", "Accept": "*/*"}, PASSED),
    ("client_kwargs.headers", {"Authorization": f"Bearer {SECRET}"}, REFUSED),
    ("client_kwargs.headers", {"authorization": SECRET}, REFUSED),
    ("client_kwargs.headers", {"Proxy-Authorization": f"Basic {SECRET}"}, REFUSED),
    ("client_kwargs.headers", {"X-Api-Key": SECRET}, REFUSED),
    ("client_kwargs.headers", {"x-goog-api-key": SECRET}, REFUSED),
    ("client_kwargs.headers", {"X-Amz-Security-Token": SECRET}, REFUSED),
    ("client_kwargs.headers", {"Cookie": f"sid={SECRET}"}, REFUSED),
    ("client_kwargs.headers", {"X-Custom": f"Bearer {SECRET}"}, REFUSED),  # the value, under any name
    ("client_kwargs.proxy", "http://proxy.example.com:3128", PASSED),
    ("client_kwargs.proxy", f"http://bob:{SECRET}@proxy.example.com:3128", REFUSED),
    ("client_kwargs.proxy_auth", ["bob", SECRET], REFUSED),
    ("client_kwargs.skip_auto_headers", ["User-Agent"], PASSED),
    ("client_kwargs.auth", ["bob", SECRET], REFUSED),
    ("client_kwargs.json_serialize", "x", PASSED),
    ("client_kwargs.json_serialize_bytes", "x", PASSED),
    ("client_kwargs.request_class", "x", PASSED),
    ("client_kwargs.response_class", "x", PASSED),
    ("client_kwargs.ws_response_class", "x", PASSED),
    ("client_kwargs.version", "1.1", PASSED),
    ("client_kwargs.cookie_jar", SECRET, REFUSED),
    ("client_kwargs.connector_owner", True, PASSED),
    ("client_kwargs.raise_for_status", True, PASSED),
    ("client_kwargs.read_timeout", 30, PASSED),
    ("client_kwargs.conn_timeout", 5, PASSED),
    ("client_kwargs.timeout", 60, PASSED),
    ("client_kwargs.auto_decompress", True, PASSED),
    ("client_kwargs.trust_env", True, PASSED),
    ("client_kwargs.requote_redirect_url", True, PASSED),
    ("client_kwargs.trace_configs", [], PASSED),
    ("client_kwargs.read_bufsize", 65536, PASSED),
    ("client_kwargs.max_line_size", 8190, PASSED),
    ("client_kwargs.max_field_size", 8190, PASSED),
    ("client_kwargs.max_headers", 128, PASSED),
    ("client_kwargs.fallback_charset_resolver", "x", PASSED),
    ("client_kwargs.middlewares", [], PASSED),
    ("client_kwargs.ssl_shutdown_timeout", 0.1, PASSED),
]
#: names other fsspec filesystems use for credentials (adlfs, ocifs, ...): refused wherever they stand
OTHER = [
    ("sas_token", SECRET, REFUSED),
    ("account_key", SECRET, REFUSED),
    ("client_secret", SECRET, REFUSED),
    ("private_key", SECRET, REFUSED),
    ("connection_string", f"DefaultEndpointsProtocol=https;AccountName=a;AccountKey={SECRET}", REFUSED),
    ("AWSSecretAccessKey", SECRET, REFUSED),
    ("sessionToken", SECRET, REFUSED),
    ("apiKey", SECRET, REFUSED),
    ("APIKEY", SECRET, REFUSED),
    ("passphrase", SECRET, REFUSED),
    ("client_id", "reflexdb", PASSED),
    ("account_name", "acct", PASSED),
]
TABLE = [("s3", *row) for row in S3] + [("gs", *row) for row in GCS] + [("http", *row) for row in HTTP] + \
    [("other", *row) for row in OTHER]


def _nested(path: str, value):
    out = value
    for part in reversed(path.split(".")):
        out = {part: out}
    return out


def _config(scheme: str, options: dict, **learner):
    # the filter reads no scheme; http(s):// cannot be checkpoint_url (read-only), so it goes through s3://
    url = "gs://b/run/" if scheme == "gs" else "s3://b/run/"
    return parse_config({"run": "r", "learner": {"checkpoint_url": url, "checkpoint_storage_options": options, **learner}})


@pytest.mark.parametrize("scheme,path,value,verdict", TABLE,
                         ids=[f"{s}:{p}:{v}" for s, p, _, v in TABLE])
def test_every_documented_storage_option_is_refused_or_passed(scheme, path, value, verdict):
    options = _nested(path, value)
    if verdict == REFUSED:
        with pytest.raises(ConfigError) as err:
            _config(scheme, options)
        message = str(err.value)
        assert f"learner.checkpoint_storage_options.{path}" in message and "environment" in message
        assert SECRET not in message
    else:  # kept as given, and stored so (runs.config and MLflow's params are the masked config)
        cfg = _config(scheme, options)
        assert cfg.learner.checkpoint_storage_options == options
        assert cfg.masked()["learner"]["checkpoint_storage_options"] == options


def _judged(rows, under: str = "") -> set[str]:
    prefix = f"{under}." if under else ""
    return {p[len(prefix):].split(".")[0] for p, _, _ in rows if p.startswith(prefix) and (under or "." not in p)}


def test_the_table_judges_every_parameter_of_the_installed_s3fs_and_botocore():
    s3fs = pytest.importorskip("s3fs")
    botocore_config = pytest.importorskip("botocore.config")
    from botocore.session import Session

    params = set(inspect.signature(s3fs.S3FileSystem.__init__).parameters) - {"self", "kwargs", "client_kwargs",
                                                                               "config_kwargs", "s3_additional_kwargs"}
    assert params <= _judged(S3), sorted(params - _judged(S3))
    config = set(botocore_config.Config.OPTION_DEFAULTS)
    assert config <= _judged(S3, "config_kwargs"), sorted(config - _judged(S3, "config_kwargs"))
    client = set(inspect.signature(Session.create_client).parameters) - {"self", "service_name", "config"}
    assert client <= _judged(S3, "client_kwargs"), sorted(client - _judged(S3, "client_kwargs"))


def test_the_table_judges_every_parameter_of_fsspecs_http_filesystem_and_aiohttp():
    from fsspec.implementations.http import HTTPFileSystem

    aiohttp = pytest.importorskip("aiohttp")
    params = set(inspect.signature(HTTPFileSystem.__init__).parameters) - {"self", "client_kwargs"}
    assert params <= _judged(HTTP), sorted(params - _judged(HTTP))
    session = set(inspect.signature(aiohttp.ClientSession.__init__).parameters) - {"self"}
    assert session <= _judged(HTTP, "client_kwargs"), sorted(session - _judged(HTTP, "client_kwargs"))


def test_the_table_judges_every_parameter_gcsfs_documents():
    assert GCSFS_PARAMETERS <= _judged(GCS)
    try:
        import gcsfs
    except ImportError:  # not installed here: its documented list above stands in
        return
    params = set(inspect.signature(gcsfs.GCSFileSystem.__init__).parameters) - {"self", "kwargs"}
    assert params <= _judged(GCS), sorted(params - _judged(GCS))


# ---------------------------------------------------------------------- the three found cases

FOUND = {
    "s3_additional_kwargs.SSECustomerKey": {"s3_additional_kwargs": {"SSECustomerKey": SECRET,
                                                                     "SSECustomerAlgorithm": "AES256"}},
    "config_kwargs.proxies.https": {"config_kwargs": {"proxies": {"https": f"http://bob:{SECRET}@proxy:3128"}}},
    "endpoint_url": {"endpoint_url": f"http://minio:{SECRET}@127.0.0.1:9000"},
}


@pytest.mark.parametrize("path", FOUND)
def test_reflexdb_check_refuses_the_found_cases_and_prints_no_secret(tmp_path, path):
    import yaml

    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"run": "r", "learner": {"checkpoint_url": "s3://b/run/",
                                                              "checkpoint_storage_options": FOUND[path]}}))
    result = CliRunner().invoke(app, ["check", str(config)])  # the CLI's main prints it and exits 2
    assert isinstance(result.exception, ConfigError), result.output
    assert f"learner.checkpoint_storage_options.{path}" in str(result.exception)
    assert SECRET not in result.output and SECRET not in str(result.exception)


def test_stored_config_mlflow_params_and_check_mask_every_url_credential(tmp_path):
    """What the run stores (``runs.config`` is ``Config.masked()``) and what MLflow gets hold no
    credential of any URL-valued setting, not only the database's."""
    import yaml

    from reflexdb.tracking import config_params

    data = {"run": "r", "database_url": f"postgresql://alice:{SECRET}@db/x",
            "learner": {"tracking_uri": f"https://bob:{SECRET}@mlflow.example.com/",
                        "checkpoint_url": "s3://b/run/", "checkpoint_storage_options": {"endpoint_url": "http://h:9000"}}}
    cfg = parse_config(data)
    masked = cfg.masked()
    assert masked["learner"]["tracking_uri"] == "https://bob:***@mlflow.example.com/"
    assert masked["database_url"] == "postgresql://alice:***@db/x"
    assert masked["learner"]["checkpoint_storage_options"] == {"endpoint_url": "http://h:9000"}
    assert SECRET not in repr(masked) and SECRET not in repr(config_params(cfg))
    assert config_params(cfg)["learner.tracking_uri"] == "https://bob:***@mlflow.example.com/"
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(data))
    result = CliRunner().invoke(app, ["check", str(config)])
    assert result.exit_code == 0 and SECRET not in result.output, result.output


# ---------------------------------------------------------------------- masking URLs

@pytest.mark.parametrize("url,masked", [
    (f"https://{SECRET}@ckpt.example.com/run/", "https://***@ckpt.example.com/run/"),
    (f"s3://{SECRET}@bucket/run/", "s3://***@bucket/run/"),
    (f"http://bob:{SECRET}@proxy:3128", "http://bob:***@proxy:3128"),
    ("s3://bucket/runs/alice@corp/v3", "s3://bucket/runs/alice@corp/v3"),  # an '@' in the path is no user
])
def test_mask_hides_a_user_part_whole_when_it_has_no_password(url, masked):
    assert storage.mask(url) == masked
    assert SECRET not in storage.scrub(f"could not reach {url}: refused", url)


def test_a_read_url_with_a_user_alone_is_refused():
    with pytest.raises(ConfigError, match="credentials in the URL are refused") as err:
        parse_config({"run": "r", "learner": {"checkpoint_url": "s3://b/run/",
                                              "checkpoint_read_url": f"https://{SECRET}@ckpt.example.com/run/"}})
    assert SECRET not in str(err.value)
