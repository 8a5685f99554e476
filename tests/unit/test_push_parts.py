"""`kit push`'s pure parts: the reference grammar, the engine's push stream, failures mapped to a fix with nothing of
a credential shown; and the command refusing a bad name before the engine is asked. The push itself, to a real
registry with TLS and a login, is tests/engine/test_push.py's."""

import base64

import docker.errors
import pytest

from helpers import run_kit
from kit.errors import BadInput, KitError
from kit.image.push import Reference, parse_reference, push, push_error, read_stream, source_tag

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize("text, registry, repository, tag", [
    ("registry.example.org/team/horovod", "registry.example.org", "registry.example.org/team/horovod", None),
    ("registry.example.org:5000/horovod:cpu-1a2b", "registry.example.org:5000", "registry.example.org:5000/horovod",
     "cpu-1a2b"),
    ("127.0.0.1:41234/kit/push-test:t1", "127.0.0.1:41234", "127.0.0.1:41234/kit/push-test", "t1"),
    ("localhost/a__b/c-d.e_f:V1.0_x", "localhost", "localhost/a__b/c-d.e_f", "V1.0_x"),
    ("localhost:5000/x--y", "localhost:5000", "localhost:5000/x--y", None),
    ("My-Registry.Example.org/kit", "My-Registry.Example.org", "My-Registry.Example.org/kit", None),
])
def test_a_registry_reference_is_read_as_docker_reads_it(text, registry, repository, tag):
    assert parse_reference(text) == Reference(registry, repository, tag)


@pytest.mark.parametrize("text, why", [
    ("horovod", "no registry"),
    ("team/horovod:cpu", "no registry: 'team' is read as part of a Docker Hub name"),
    ("registry.example.org/Team/horovod", "a repository name is lower case"),
    ("registry.example.org/team/horovod:-bad", "not a Docker image reference"),
    ("registry.example.org/horovod:" + "t" * 129, "not a Docker image reference"),
    ("registry.example.org/horovod:a:b", "not a Docker image reference"),
    ("registry.example.org/horovod;rm -rf ~", "not a Docker image reference"),
    ("registry.example.org/$(reboot)", "not a Docker image reference"),
    ("registry.example.org/h`id`:x", "not a Docker image reference"),
    ("registry.example.org/h:t&&id", "not a Docker image reference"),
    ("registry.example.org/h\n:t", "not a Docker image reference"),
    ("registry.example.org/", "not a Docker image reference"),
    ("registry.example.org//x", "not a Docker image reference"),
    ("-registry.example.org/x", "not a Docker image reference"),
    ("registry.example.org/x.", "not a Docker image reference"),
    ("registry.example.org/horovod@" + DIGEST, "a digest"),
    ("user@registry.example.org/horovod", "a digest (@sha256:...) or a user@"),
    ("registry.example.org/" + "a" * 255, "longer than 255"),
    ("", "no registry"),
])
def test_a_bad_reference_is_bad_input_naming_it_and_the_form(text, why):
    with pytest.raises(BadInput) as e:
        parse_reference(text)
    assert why in str(e.value) and e.value.exit_code == 2
    assert str(e.value).startswith("REGISTRY/REPO:TAG ") and "\n" not in str(e.value)
    assert e.value.hint.startswith("give REGISTRY/REPO[:TAG], e.g. ")


@pytest.mark.parametrize("image, tag", [("kit/horovod:cpu-1a2b", "cpu-1a2b"), ("kit/horovod", "latest"),
                                        ("localhost:5000/kit/h", "latest"), ("localhost:5000/kit/h:v2", "v2")])
def test_the_push_keeps_the_images_own_tag_unless_told(image, tag):
    assert source_tag(image) == tag


# The engine's push stream as docker-py decodes it (shape of Docker 20.10's): two layers sent, one already there.
REF = parse_reference("127.0.0.1:5000/kit/h:cpu")
STREAM = [
    {"status": "The push refers to repository [127.0.0.1:5000/kit/h]"},
    {"status": "Preparing", "progressDetail": {}, "id": "5f70bf18a086"},
    {"status": "Preparing", "progressDetail": {}, "id": "e6c1a9b9d0f2"},
    {"status": "Preparing", "progressDetail": {}, "id": "0a1b2c3d4e5f"},
    {"status": "Waiting", "progressDetail": {}, "id": "e6c1a9b9d0f2"},
    {"status": "Layer already exists", "progressDetail": {}, "id": "0a1b2c3d4e5f"},
    {"status": "Pushing", "progressDetail": {"current": 512, "total": 2048}, "progress": "[===>   ]", "id": "5f70bf18a086"},
    {"status": "Pushing", "progressDetail": {"current": 2048, "total": 2048}, "progress": "[======>]", "id": "5f70bf18a086"},
    {"status": "Pushed", "progressDetail": {}, "id": "5f70bf18a086"},
    {"status": "Pushing", "progressDetail": {"current": 100, "total": 4096}, "id": "e6c1a9b9d0f2"},
    {"status": "Pushed", "progressDetail": {}, "id": "e6c1a9b9d0f2"},
    {"status": f"cpu: digest: {DIGEST} size: 735"},
    {"progressDetail": {}, "aux": {"Tag": "cpu", "Digest": DIGEST, "Size": 735}},
]


def test_the_stream_gives_each_layers_state_and_the_digest():
    seen = []
    done = read_stream(iter(STREAM), REF, on_layer=lambda layer: seen.append((layer.id, layer.state, layer.current)))
    assert (done.digest, done.sent, done.present) == (DIGEST, 2, 1)
    assert {i: (layer.state, layer.current, layer.total) for i, layer in done.layers.items()} == {
        "5f70bf18a086": ("Pushed", 2048, 2048), "e6c1a9b9d0f2": ("Pushed", 100, 4096),
        "0a1b2c3d4e5f": ("Layer already exists", 0, None)}
    assert seen[5:7] == [("5f70bf18a086", "Pushing", 512), ("5f70bf18a086", "Pushing", 2048)]


def test_a_second_push_sends_nothing():
    again = [e if e.get("id") is None or e["status"] in ("Preparing", "Waiting") else
             {"status": "Layer already exists", "progressDetail": {}, "id": e["id"]} for e in STREAM]
    again.insert(3, {"status": "Mounted from kit/other", "progressDetail": {}, "id": "77aa77aa77aa"})
    done = read_stream(again, REF)
    assert (done.sent, done.present) == (0, 4)


def test_a_stream_without_a_digest_is_a_failure():
    with pytest.raises(KitError, match="ended without the pushed digest"):
        read_stream(STREAM[:-1], REF)
    with pytest.raises(KitError, match="ended without the pushed digest"):
        read_stream([{"aux": {"Digest": "sha256:zz; rm -rf /"}}], REF)


@pytest.mark.parametrize("message, what, fix", [
    ("unauthorized: authentication required", "refused the login", "docker login 127.0.0.1:5000"),
    ("no basic auth credentials", "refused the login", "docker login 127.0.0.1:5000"),
    ("denied: requested access to the resource is denied", "denied the push", "docker login 127.0.0.1:5000"),
    ('Get "https://127.0.0.1:5000/v2/": x509: certificate signed by unknown authority', "TLS certificate",
     "/etc/docker/certs.d/127.0.0.1:5000/ca.crt"),
    ('Get "https://127.0.0.1:5000/v2/": dial tcp 127.0.0.1:5000: connect: connection refused', "does not answer",
     "curl https://127.0.0.1:5000/v2/"),
    ('Get "https://127.0.0.1:5000/v2/": http: server gave HTTP response to HTTPS client', "plain HTTP",
     "insecure-registries"),
    ("blob upload unknown", "", "`docker push 127.0.0.1:5000/kit/h:cpu`"),
])
def test_a_failure_in_the_stream_names_the_registry_and_the_fix(message, what, fix):
    with pytest.raises(KitError) as e:
        read_stream([STREAM[1], {"errorDetail": {"message": message}, "error": message}], REF)
    assert type(e.value) is KitError and e.value.exit_code == 1
    assert str(e.value).startswith("push to 127.0.0.1:5000 failed: ") and what in str(e.value)
    assert str(e.value).endswith(message) and fix in e.value.hint


def test_nothing_credential_like_in_a_failure_is_shown():
    auth = base64.b64encode(b"kit:s3cret-pw").decode()
    message = (f'Get "https://kit:s3cret-pw@127.0.0.1:5000/v2/": unauthorized; Authorization: Basic {auth}; '
               f'{{"auth": "{auth}", "password": "s3cret-pw"}} \x1b[2J\u202e')
    shown = str(push_error(REF, message))
    assert "s3cret-pw" not in shown and auth not in shown and "\x1b" not in shown and "\u202e" not in shown
    assert "https://****@127.0.0.1:5000/v2/" in shown and "Authorization: Basic ****" in shown
    assert "\\x1b[2J\\u202e" in shown  # the rest is shown, made visible


JWT = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJyb2JvdCJ9.c2lnbmF0dXJlX29mX3RoZV90b2tlbg"
# How the registries users have put a credential into what the engine says (the secret: SECRET, or the token itself).
CREDENTIALS = {
    "Docker Hub, a PAT in a URL": 'Get "https://kit:dckr_pat_2bSECRETaaaaaaaaaaaaaaa@registry-1.docker.io/v2/"',
    "Docker Hub, the token service": "Get https://auth.docker.io/token?scope=repository:kit:push&account=kit"
                                     "&access_token=SECRET: unauthorized",
    "GHCR, a bearer header": "authorization: bearer ghp_SECRETabcdefghijklmnopqrstuvwx denied",
    "GHCR, a PAT alone": "denied: token ghp_SECRETabcdefghijklmnopqrstuvwx has no write:packages",
    "GitLab, a job token": "HTTP Basic: Access denied (JOB-TOKEN: SECRET-4Kq)",
    "GitLab, a personal token": "401 glpat-SECRETxxxxxxxxxxxxxxx is revoked",
    "GitLab, private_token in a query": "GET https://gitlab.example.com/jwt/auth?private_token=SECRET&service=x 401",
    "Harbor, a robot's JSON": '{"username": "robot$kit", "password": "SECRET"}',
    "Harbor, JSON auth": '{"auths": {"harbor.lab": {"auth": "a2l0OlNFQ1JFVA=="}}}',
    "ECR, a pre-signed layer URL": "https://prod-eu.s3.amazonaws.com/layer?X-Amz-Algorithm=AWS4-HMAC-SHA256"
                                   "&X-Amz-Credential=AKIASECRETAAAAAAAAAA%2F2026&X-Amz-Signature=SECRETabc123",
    "ECR, a header": "Authorization: AWS4-HMAC-SHA256 Credential=AKIASECRETAAAAAAAAAA/2026, Signature=SECRET",
    "ECR, a session token": "x-amz-security-token=SECRETIQoJb3JpZ2luX2VjEJr",
    "Artifactory, an API key header": "X-JFrog-Art-Api: SECRETAKCp8kXyZ returned 403",
    "Artifactory, apiKey in JSON": '{"apiKey":"SECRET"}',
    "a registry's JWT": f"Bearer {JWT}",
    "a JWT alone": f"token {JWT} expired",
    "an identity token": '"IdentityToken": "SECRET"',
    "a password= in a log": "login: PASSWORD=SECRET failed",
    "an Azure SAS URL": "https://acct.blob.core.windows.net/c/blob?sv=2024-01-01&se=2026&sig=SECRET%3D",
    "AWS keys in a config": "aws_secret_access_key=SECRETwJalrXUtnFEMI aws_session_token = SECRETFwoGZX",
    "an API key header": "x-api-key: SECRETk3y rejected",
    "docker's registry auth header": "X-Registry-Auth: eyJ1c2VybmFtZSI6ImtpdCIsInBhc3N3b3JkIjoiU0VDUkVUIn0SECRET",
    "a quoted password with spaces": 'password="SECRET a2l0OlNFQ1JFVA words" wrong',
    "a CI variable's name ending in the key": "env: DOCKER_PASSWORD=SECRETh2 NPM_TOKEN=SECRETabcd CI_JOB_TOKEN=SECRETx",
    "a header named with the key last": "X-Auth-Token: SECRETs3cr3t rejected",
    "a password with a comma, a semicolon and an ampersand in it": "login: password=SECRETa,SECRETb;SECRETc&SECRETd, no",
}


@pytest.mark.parametrize("form", CREDENTIALS)
def test_a_credential_of_any_registry_never_reaches_a_shown_failure(form):
    """One redaction (kit.redact, pip's URL masking's too): by key whatever the case, by shape for tokens."""
    message = CREDENTIALS[form]
    shown = str(push_error(REF, message))
    for secret in ("SECRET", "2bSECRET", "a2l0OlNFQ1JFVA", JWT.split(".")[1], "AKIASECRET"):
        assert secret not in shown, (form, shown)
    assert "****" in shown


def test_what_holds_no_credential_is_shown_as_it_is():
    message = ("denied: requested access to the resource is denied; tag 2.3.1-cu128 of kit-horovod at "
               "https://registry.lab:5000/v2/kit/manifests/2.3.1 (a token of 3 parts is needed; max_tokens=512, "
               "oauth2=enabled)")
    assert push_error(REF, message).message.endswith(message)


class FakeImage:
    def __init__(self, calls):
        self.calls = calls

    def tag(self, repository, tag):
        self.calls.append(("tag", repository, tag))


class FakeClient:
    """Records what push asks of docker-py (argv building only: the real engine is the lab test's)."""

    def __init__(self, images, stream):
        self.calls, self.known, self.stream = [], images, stream
        self.images, self.api = self, self

    def get(self, name):
        if name not in self.known:
            raise docker.errors.ImageNotFound(f"No such image: {name}")
        return FakeImage(self.calls)

    def push(self, repository, tag, **kw):
        self.calls.append(("push", repository, tag, kw))
        return iter(self.stream)


def test_push_tags_the_image_and_pushes_that_tag_by_the_sdks_stream():
    client = FakeClient({"kit/horovod:cpu-1a2b"}, STREAM)
    done = push(client, "kit/horovod:cpu-1a2b", parse_reference("127.0.0.1:5000/kit/h"))
    assert client.calls == [("tag", "127.0.0.1:5000/kit/h", "cpu-1a2b"),
                            ("push", "127.0.0.1:5000/kit/h", "cpu-1a2b", {"stream": True, "decode": True})]
    assert (str(done.reference), done.digest) == ("127.0.0.1:5000/kit/h:cpu-1a2b", DIGEST)


def test_a_missing_local_image_is_bad_input_and_nothing_is_tagged_or_pushed():
    client = FakeClient(set(), STREAM)
    with pytest.raises(BadInput) as e:
        push(client, "kit/nothing:1", REF)
    assert str(e.value) == "--image kit/nothing:1: no such image on this machine" and "kit build" in e.value.hint
    assert client.calls == []


@pytest.mark.parametrize("name", ["team/horovod", "registry.example.org/Horovod", "localhost:5000/h;id"])
def test_the_command_refuses_a_bad_name_with_exit_2_before_asking_the_engine(in_tmp, name):
    # an engine that cannot be reached: had kit asked it, the answer would be exit 1, "does not answer"
    r = run_kit("push", name, cwd=in_tmp, env={"DOCKER_HOST": "unix:///nonexistent/kit-test.sock"})
    lines = r.stderr.splitlines()
    assert (r.returncode, r.stdout, len(lines)) == (2, "", 2), r.stderr
    assert lines[0].startswith(f"error: REGISTRY/REPO:TAG {name!r}: ") and lines[1].startswith("fix: give ")
