"""Job identity and output names: pure functions, tested as properties over hostile input; and
the job's payload, which must stay what Durable history already holds.

No storage here: ``job_id_for``, ``tile_blob_name`` and ``check_upload_name`` are pure, so
hypothesis drives them with names an uploader could choose (unicode with combining marks, RTL,
emoji, spaces, ``..``, ``%`` sequences, names up to Azure's 1024-character limit) and with URLs
as they arrive (percent-encoded or raw, with SAS tokens, quoted ETags).
"""

from __future__ import annotations

import dataclasses
import json
import re
import string
import unicodedata
from pathlib import Path
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from tilecommit.errors import BadInputError, ConfigurationError, InvalidNameError
from tilecommit.grid import Window
from tilecommit.jobs import (
    DEFAULT_SHARE_BYTES,
    MAX_BLOB_NAME_CHARS,
    Job,
    check_job_id,
    check_upload_name,
    job_id_for,
    mosaic_blob_name,
    normalise_blob_url,
    normalise_etag,
    quicklook_blob_name,
    stac_blob_name,
    tile_blob_name,
)
from tilecommit.settings import DEFAULT_WINDOW_SIZE, Settings
from tilecommit.spec import OutputSpec

JOB_ID = re.compile(r"[0-9a-f]{16}")  # used with fullmatch only
ACCOUNT_URL = "https://tilecommitprod.blob.core.windows.net"
AZURITE_URL = "http://127.0.0.1:10000/devstoreaccount1"
CONTAINER = "raster-uploads"
ETAG = '"0x8DC5B1C2D3E4F50"'
SPEC = OutputSpec()

# Deterministic and CPU-light: the machine is shared.
PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ----------------------------------------------------------------------------- strategies

#: Characters an uploader can put in a name: combining marks, RTL scripts and marks, emoji
#: (astral plane), spaces of several kinds, URL-significant punctuation.
HOSTILE_CHARS = (
    "aZ09 -_.~/"
    "%?#&=+;:@!$'()*,[]\\\"<>{}|^`"
    "\u0301\u0308\u0327\u20dd"  # combining acute, diaeresis, cedilla, enclosing circle
    "\u05d0\u05e9\u0627\u0644\u200f\u200e\u202e"  # Hebrew, Arabic, RLM, LRM, RLO
    "\U0001f600\U0001f3f3\ufe0f\u200d\U0001f308"  # emoji, variation selector, ZWJ
    "\u00a0\u3000\u2028"  # no-break space, ideographic space, line separator
    "\u00e9\u1e9b\u212b\ufb01"  # precomposed / compatibility characters
)
hostile_text = st.text(alphabet=st.sampled_from(HOSTILE_CHARS), min_size=1, max_size=60)
#: Any unicode at all, surrogates and control characters included.
any_text = st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=80)


@st.composite
def names(draw, alphabet=hostile_text):
    """A blob name built from hostile pieces, with '..' and '%' sequences mixed in."""
    pieces = draw(
        st.lists(
            st.one_of(
                alphabet,
                st.sampled_from(["..", ".", "%", "%20", "%2F", "%25", "%zz", "%E2%82%AC", "a b", "x?y", "#frag"]),
            ),
            min_size=1,
            max_size=6,
        )
    )
    name = draw(st.sampled_from(["", "dir/", "a/b/"])) + "".join(pieces)
    # Hostile but storable: the names an uploader can really give a blob.
    assume(check_upload_name_ok(name))
    return name


#: Names an uploader can store and reach by a URL whose path is raw (not percent-encoded): no
#: '%' (a raw '%' would read as an escape), no '?' or '#' (they would end the path).
raw_safe_names = names(
    alphabet=st.text(
        alphabet=st.sampled_from(HOSTILE_CHARS.replace("%", "").replace("?", "").replace("#", "")),
        min_size=1,
        max_size=60,
    )
).filter(lambda n: not any(c in n for c in "%?#"))


def encoded_url(name: str, base: str = ACCOUNT_URL, container: str = CONTAINER) -> str:
    """The URL the SDK and Event Grid send: every reserved or non-ASCII byte percent-encoded."""
    return f"{base}/{container}/{quote(name, safe='/')}"


def raw_url(name: str, base: str = ACCOUNT_URL, container: str = CONTAINER) -> str:
    return f"{base}/{container}/{name}"


def id_or_invalid(url, etag):
    """job_id_for's result, or the InvalidNameError it raised; any other exception propagates."""
    try:
        return job_id_for(url, etag, SPEC)
    except InvalidNameError as exc:
        return exc


# ----------------------------------------------------------------------------- job_id_for


#: Names near Azure's 1024-character limit.
long_names = st.text(
    alphabet=st.sampled_from(HOSTILE_CHARS), min_size=MAX_BLOB_NAME_CHARS - 30, max_size=MAX_BLOB_NAME_CHARS
).filter(lambda n: check_upload_name_ok(n))


@PROPS
@given(name=st.one_of(names(), long_names))
@example(name="a" * MAX_BLOB_NAME_CHARS)
@example(name="\U0001f600" * MAX_BLOB_NAME_CHARS)
@example(name="../../etc/passwd")
@example(name="%2e%2e/%2e%2e")
@example(name=" ")
def test_job_id_is_16_lowercase_hex_and_deterministic(name):
    url = encoded_url(name)
    first = job_id_for(url, ETAG, SPEC)
    assert JOB_ID.fullmatch(first), first
    assert job_id_for(url, ETAG, SPEC) == first
    assert check_job_id(first) == first


@PROPS
@given(url=any_text, etag=any_text)
@example(url="https://h:abc/c/b", etag=ETAG)
@example(url="https://h:99999/c/b", etag=ETAG)
@example(url="https://[::1/c/b", etag=ETAG)
@example(url=ACCOUNT_URL + "/c/a\ud800", etag=ETAG)
@example(url=ACCOUNT_URL + "/c/a", etag="0x\udc00")
@example(url="ftp://h/c/b", etag=ETAG)
@example(url="https://h/c", etag=ETAG)
@example(url="https:///c/b", etag=ETAG)
@example(url=ACCOUNT_URL + "/c/b", etag='""')
@example(url=ACCOUNT_URL + "/c/b", etag="W/")
@example(url="", etag=ETAG)
def test_job_id_for_arbitrary_text_is_an_id_or_invalid_name(url, etag):
    """Whatever arrives as URL and ETag: 16 hex characters or InvalidNameError, nothing else."""
    result = id_or_invalid(url, etag)
    if isinstance(result, InvalidNameError):
        assert isinstance(result, BadInputError) and str(result)
    else:
        assert JOB_ID.fullmatch(result)


@PROPS
@given(url_prefix=st.sampled_from(["https://h/c/", ACCOUNT_URL + "/"]), rest=any_text)
def test_job_id_for_url_like_text_is_an_id_or_invalid_name(url_prefix, rest):
    result = id_or_invalid(url_prefix + rest, ETAG)
    assert isinstance(result, InvalidNameError) or JOB_ID.fullmatch(result)


@pytest.mark.parametrize("url", [None, 42, b"https://h/c/b", "   "])
def test_job_id_for_non_text_url_is_invalid_name(url):
    with pytest.raises(InvalidNameError):
        job_id_for(url, ETAG, SPEC)


@pytest.mark.parametrize("etag", [None, 7, b"0x1", "", "   ", '""', 'W/""'])
def test_job_id_for_missing_etag_is_invalid_name(etag):
    with pytest.raises(InvalidNameError):
        job_id_for(encoded_url("a.tif"), etag, SPEC)


@PROPS
@given(name=raw_safe_names, base=st.sampled_from([ACCOUNT_URL, AZURITE_URL]))
@example(name="a b.tif", base=ACCOUNT_URL)
@example(name="trailing space ", base=ACCOUNT_URL)
@example(name="\u05d0\u05e9 \U0001f600.tif", base=ACCOUNT_URL)
@example(name="e\u0301.tif", base=ACCOUNT_URL)
@example(name="..", base=ACCOUNT_URL)
def test_percent_encoded_and_raw_path_name_the_same_blob(name, base):
    """The blob trigger, Event Grid and a user may spell the same blob's URL raw or encoded."""
    assume(check_upload_name_ok(name))
    assert job_id_for(raw_url(name, base), ETAG, SPEC) == job_id_for(encoded_url(name, base), ETAG, SPEC)


@PROPS
@given(
    name=names(),
    query=st.one_of(
        st.just("?sv=2023-11-03&ss=b&srt=o&sp=r&se=2030-01-01T00%3A00%3A00Z&sig=abc%2Bdef%3D"),
        st.just("?snapshot=2024-01-01T00:00:00.0000000Z"),
        st.just("?versionid=2024-01-01T00:00:00.1234567Z&comp=metadata"),
        st.just("?"),
        st.text(alphabet=string.ascii_letters + string.digits + "=&%+/:.-", max_size=60).map(lambda q: "?" + q),
    ),
    fragment=st.sampled_from(["", "#", "#part"]),
)
def test_query_string_and_fragment_are_ignored(name, query, fragment):
    url = encoded_url(name)
    assert job_id_for(url + query + fragment, ETAG, SPEC) == job_id_for(url, ETAG, SPEC)


@PROPS
@given(name=names(), etag=st.text(alphabet="0123456789ABCDEFx", min_size=1, max_size=20))
def test_quotes_and_weak_marker_around_the_etag_are_ignored(name, etag):
    url = encoded_url(name)
    bare = job_id_for(url, etag, SPEC)
    assert job_id_for(url, f'"{etag}"', SPEC) == bare
    assert job_id_for(url, f'W/"{etag}"', SPEC) == bare
    assert job_id_for(url, f' "{etag}" ', SPEC) == bare


@PROPS
@given(
    name=names(),
    etags=st.lists(st.text(alphabet="0123456789ABCDEF", min_size=1, max_size=16), min_size=2, max_size=2, unique=True),
)
def test_a_different_etag_gives_a_different_job(name, etags):
    url = encoded_url(name)
    assert job_id_for(url, "0x" + etags[0], SPEC) != job_id_for(url, "0x" + etags[1], SPEC)


@PROPS
@given(
    names_=st.lists(names(), min_size=2, max_size=2, unique=True).filter(
        # NFC normalisation of the name is a documented choice of normalise_blob_url: names that
        # differ only in their Unicode normal form are taken to be the same blob.
        lambda pair: unicodedata.normalize("NFC", pair[0]) != unicodedata.normalize("NFC", pair[1])
    )
)
@example(names_=["a//b.tif", "a/b.tif"])
@example(names_=["dir//x", "dir/x"])
@example(names_=["x.tif ", "x.tif"])
def test_different_blobs_get_different_jobs(names_):
    """Two blob names Azure keeps apart never share a job id, even with the same ETag."""
    a, b = names_
    assert job_id_for(encoded_url(a), ETAG, SPEC) != job_id_for(encoded_url(b), ETAG, SPEC)


def test_same_name_in_another_container_or_account_is_another_job():
    url = encoded_url("scene.tif")
    assert job_id_for(url, ETAG, SPEC) != job_id_for(encoded_url("scene.tif", container="other"), ETAG, SPEC)
    assert job_id_for(url, ETAG, SPEC) != job_id_for(
        encoded_url("scene.tif", base="https://otheraccount.blob.core.windows.net"), ETAG, SPEC
    )


def test_scheme_host_case_and_default_port_are_normalised():
    url = encoded_url("scene.tif")
    assert job_id_for(url.replace("https://tilecommitprod", "HTTPS://TileCommitProd"), ETAG, SPEC) == job_id_for(
        url, ETAG, SPEC
    )
    assert job_id_for(url.replace(".net/", ".net:443/"), ETAG, SPEC) == job_id_for(url, ETAG, SPEC)
    # The container and blob name are case-sensitive in Azure: they are kept as they are.
    assert job_id_for(encoded_url("Scene.tif"), ETAG, SPEC) != job_id_for(url, ETAG, SPEC)


def test_normalised_url_drops_query_and_encodes_one_way():
    assert (
        normalise_blob_url(f"{ACCOUNT_URL}/{CONTAINER}/a b/\u00e9.tif?sig=x#f")
        == f"{ACCOUNT_URL}/{CONTAINER}/a%20b/%C3%A9.tif"
    )
    assert normalise_etag('W/"0x1"') == "0x1"


# ----------------------------------------------------------------------------- tile names


job_ids = st.text(alphabet="0123456789abcdef", min_size=16, max_size=16)
windows = st.builds(
    Window,
    row=st.integers(0, 20000),
    col=st.integers(0, 20000),
    row_off=st.integers(0, 10**6),
    col_off=st.integers(0, 10**6),
    height=st.integers(1, 4096),
    width=st.integers(1, 4096),
)


@PROPS
@given(job_id=job_ids, window=windows)
def test_tile_blob_name_is_a_pure_function_of_job_and_grid_position(job_id, window):
    name = tile_blob_name(job_id, window)
    assert name == f"tiles/{job_id}/{window.row:04d}_{window.col:04d}.tif"
    assert tile_blob_name(job_id, window) == name
    # Only the grid position matters, not the pixel bounds: a re-planned window keeps its key.
    moved = Window(window.row, window.col, 0, 0, 1, 1)
    assert tile_blob_name(job_id, moved) == name
    assert check_upload_name(name) == name


@PROPS
@given(job_id=job_ids, a=windows, b=windows)
def test_tile_blob_names_differ_for_different_grid_positions(job_id, a, b):
    assume((a.row, a.col) != (b.row, b.col))
    assert tile_blob_name(job_id, a) != tile_blob_name(job_id, b)


@PROPS
@given(job_id=any_text.filter(lambda s: not JOB_ID.fullmatch(s)))
@example(job_id="0123456789ABCDEF")
@example(job_id="0123456789abcde")
@example(job_id="0123456789abcdef0")
@example(job_id="0123456789abcdef\n")
@example(job_id="../../../../etc/")
def test_tile_blob_name_refuses_anything_but_a_job_id(job_id):
    window = Window(0, 0, 0, 0, 256, 256)
    for make in (
        lambda: tile_blob_name(job_id, window),
        lambda: mosaic_blob_name(job_id),
        lambda: stac_blob_name(job_id),
        lambda: quicklook_blob_name(job_id),
    ):
        with pytest.raises(InvalidNameError):
            make()


@pytest.mark.parametrize("row, col", [(-1, 0), (0, -1), (-5, -5)])
def test_tile_blob_name_refuses_negative_grid_positions(row, col):
    with pytest.raises(InvalidNameError):
        tile_blob_name("0123456789abcdef", Window(row, col, 0, 0, 1, 1))


def test_output_names_of_a_job():
    job = job_id_for(encoded_url("scene.tif"), ETAG, SPEC)
    assert mosaic_blob_name(job) == f"mosaics/{job}/mosaic.tif"
    assert stac_blob_name(job) == f"mosaics/{job}/item.json"
    assert quicklook_blob_name(job) == f"mosaics/{job}/quicklook.png"
    assert tile_blob_name(job, Window(3, 12, 3072, 12288, 1024, 1024)) == f"tiles/{job}/0003_0012.tif"


# ----------------------------------------------------------------------------- the output spec


def test_another_window_size_is_another_job_with_other_keys():
    url = encoded_url("scene.tif")
    ids = {size: job_id_for(url, ETAG, OutputSpec(window_size=size)) for size in (256, 512, 768, 1024, 2048)}
    assert len(set(ids.values())) == len(ids), ids
    window = Window(0, 0, 0, 0, 256, 256)
    assert tile_blob_name(ids[512], window) != tile_blob_name(ids[1024], window)
    assert mosaic_blob_name(ids[512]) != mosaic_blob_name(ids[1024])


def test_the_job_id_depends_on_the_specs_values_only():
    url = encoded_url("scene.tif")
    spec = OutputSpec(window_size=512)
    again = OutputSpec.from_dict(json.loads(json.dumps(spec.to_dict())))
    assert again == spec
    assert job_id_for(url, ETAG, again) == job_id_for(url, ETAG, spec)
    assert job_id_for(url, ETAG, OutputSpec()) == job_id_for(url, ETAG, OutputSpec(window_size=DEFAULT_WINDOW_SIZE))
    assert spec.canonical() == '{"block_size":256,"profile":"default","window_size":512}'


def test_a_job_id_needs_a_spec():
    with pytest.raises(TypeError, match="OutputSpec"):
        job_id_for(encoded_url("scene.tif"), ETAG, {"window_size": 1024})


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"window_size": 300}, "multiple of 256"),
        ({"window_size": 0}, "multiple of 256"),
        ({"window_size": -256}, "multiple of 256"),
        ({"block_size": 1024}, "blocks of (256, 512) pixels only"),
        ({"block_size": 512, "window_size": 768}, "multiple of 512"),
        ({"profile": "web"}, "is not one of default, zstd, lzw, raw"),
    ],
)
def test_a_spec_this_build_cannot_make_is_refused(fields, message):
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        OutputSpec(**fields)


def test_the_starter_puts_the_spec_of_its_settings_in_the_payload_and_the_id():
    url = encoded_url("scene.tif")
    job = Job.for_upload("scene.tif", url, ETAG, 10, Settings(window_size=512)).to_dict()
    assert job["spec"] == {"window_size": 512, "block_size": 256, "profile": "default"}
    assert Job.from_dict(job).spec == OutputSpec(window_size=512)
    assert job["job_id"] == job_id_for(url, ETAG, OutputSpec(window_size=512))
    assert Job.for_upload("scene.tif", url, ETAG, 10, Settings()).job_id == job_id_for(url, ETAG, OutputSpec())
    assert "window_size" not in job, "one place for the window size: the spec"


# ----------------------------------------------------------------------------- the job's payload

#: Payloads the starter made before the job was a record (its ``job_input`` building the dict by
#: hand), with what it was given: every profile and option the tests use, path rules, metadata it
#: cannot make. Durable history holds payloads like these.
STARTED = json.loads((Path(__file__).parent / "fixtures" / "job_payloads.json").read_text())


@pytest.mark.parametrize("case", STARTED, ids=[c["case"] for c in STARTED])
def test_a_job_is_made_and_written_as_the_payload_the_starter_made_before(case):
    made = Job.for_upload(
        case["blob"], case["url"], case["etag"], case["size"], Settings(**case["settings"]), case["metadata"]
    )
    # The same keys in the same order with the same values: the same JSON in the history, and
    # after them the fields added since (the collection, tilecommit/catalog/naming.py; the levels
    # per node of the coarse levels' reduction tree, tilecommit/raster/assembly/reduction.py, and
    # whether the service copies its intermediates, coarse_levels.py).
    since = made.to_dict()
    assert list(since)[len(case["payload"]) :] == ["collection", "coarse_levels_per_node", "coarse_levels_copied"]
    assert json.dumps({k: since[k] for k in case["payload"]}) == json.dumps(case["payload"])
    read = Job.from_dict(case["payload"])
    old = dataclasses.replace(made, collection=None, coarse_levels_per_node=None, coarse_levels_copied=None)
    assert read == old and json.dumps(read.to_dict()) == json.dumps(case["payload"])
    assert read.spec == OutputSpec.from_dict(case["payload"]["spec"])


def test_every_job_in_recorded_durable_history_reads_and_writes_as_it_was_stored():
    """The jobs of orchestrations the local host ran before the job was a record (the replay
    fixture, tests/test_replay_history.py): each reads back as a Job whose payload is the same JSON."""
    recorded = json.loads((Path(__file__).parent / "fixtures" / "replay" / "jobs.json").read_text())
    inputs = [json.loads(i["input"]) for o in recorded["orchestrations"] for i in o["instances"]]
    stored = [payload.get("job", payload) for payload in inputs]
    assert len(stored) > 3
    for payload in stored:
        assert json.dumps(Job.from_dict(payload).to_dict()) == json.dumps(payload)


def test_the_payloads_cover_the_optional_parts():
    """The control: the fixture holds payloads with and without profile options and errors."""
    payloads = [c["payload"] for c in STARTED]
    assert any("profile_error" in p for p in payloads) and any("profile_error" not in p for p in payloads)
    assert any("profile_options" in p["spec"] for p in payloads)
    assert {p["spec"]["block_size"] for p in payloads} == {256, 512}


def test_a_payload_from_before_the_spec_or_the_shares_reads_as_the_job_it_was():
    """Before the spec, a payload named only its window size (its tiles had the default block size
    and profile); before the split staging, it named no share size (the default then applies)."""
    today = STARTED[0]["payload"]
    before_shares = {k: v for k, v in today.items() if k != "assembly_share_bytes"}
    job = Job.from_dict(before_shares)
    assert job.assembly_share_bytes is None and job.share_bytes == DEFAULT_SHARE_BYTES
    assert job.to_dict() == before_shares  # an optional field left out stays out
    before_spec = {**{k: v for k, v in before_shares.items() if k != "spec"}, "window_size": 512}
    job = Job.from_dict(before_spec)
    assert job.spec == OutputSpec(window_size=512)
    assert Job.from_dict(job.to_dict()) == job
    assert Job.from_dict({**today, "scene_width": 4096}) == Job.from_dict(today)  # unknown keys: ignored


# ----------------------------------------------------------------------------- check_upload_name


def check_upload_name_ok(name) -> bool:
    """The rule check_upload_name documents, written out independently."""
    return (
        isinstance(name, str)
        and 1 <= len(name) <= MAX_BLOB_NAME_CHARS
        and not any(ord(c) < 0x20 or ord(c) == 0x7F or 0xD800 <= ord(c) <= 0xDFFF for c in name)
        and not name.startswith("/")
        and not name.endswith(("/", "."))
    )


@PROPS
@given(name=st.one_of(names(), any_text, st.text(min_size=1000, max_size=1100)))
@example(name="a" * MAX_BLOB_NAME_CHARS)
@example(name="a" * (MAX_BLOB_NAME_CHARS + 1))
@example(name="..")
@example(name="../x")
@example(name="a b")
@example(name="/abs")
@example(name="dir/")
@example(name="bad\x00name")
@example(name="bad\x7fname")
@example(name="half\ud800")
@example(name="\u05d0\u202e\U0001f600")
def test_check_upload_name_returns_the_name_or_says_why_not(name):
    if check_upload_name_ok(name):
        assert check_upload_name(name) is name
    else:
        with pytest.raises(InvalidNameError) as info:
            check_upload_name(name)
        assert str(info.value)


@pytest.mark.parametrize("name", [None, 3, b"abc", ""])
def test_check_upload_name_refuses_non_text(name):
    with pytest.raises(InvalidNameError):
        check_upload_name(name)


@PROPS
@given(name=names())
def test_every_accepted_upload_name_has_a_job_id(name):
    """A name check_upload_name accepts always yields a job id from its (encoded) URL."""
    assume(check_upload_name_ok(name))
    assert JOB_ID.fullmatch(job_id_for(encoded_url(check_upload_name(name)), ETAG, SPEC))
