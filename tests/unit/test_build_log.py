"""BuildLog on build streams captured from a real Docker engine (tests/unit/data)."""

import json
from pathlib import Path

from kit.image.build import BuildLog

DATA = Path(__file__).parent / "data"


def replay(name: str, log: BuildLog) -> list:
    done = []
    for line in (DATA / name).read_text().splitlines():
        done += log.feed(json.loads(line))
    return done + log.finish()


def test_successful_build_is_folded_into_steps():
    lines: list[str] = []
    log = BuildLog(on_line=lines.append)
    done = replay("build_stream_ok.jsonl", log)
    assert [s.number for s in done] == [1, 2, 3, 4]
    assert [s.instruction for s in done][1:] == ["RUN echo first step output", "RUN echo second step output",
                                                 "LABEL x=y"]
    assert [s.cached for s in done] == [False, True, False, False]
    assert all(s.total == 4 for s in done)
    assert "second step output" in done[2].lines
    assert log.image_id.startswith("sha256:13a56c03") and log.error is None
    assert "second step output" in lines


def test_failed_build_names_the_step_and_keeps_its_tail():
    log = BuildLog()
    done = replay("build_stream_failed.jsonl", log)
    assert [s.number for s in done] == [1, 2]  # step 3 never finished
    err = log.failure()
    assert str(err).startswith("image build failed at step 3/3 RUN echo building thing;")
    assert "returned a non-zero code: 100" in str(err)
    assert err.output_tail.splitlines()[-3:] == ["building thing", "E: Unable to locate package nope",
                                                 "Removing intermediate container 6b0f2febe308"]
    assert "\x1b" not in err.output_tail
    assert "--verbose" in err.hint


def test_chunks_split_mid_line_are_joined():
    log = BuildLog()
    for piece in ["Step 1/1 : RUN ma", "ke\n", " ---> Running in x\nhal", "f a line\n"]:
        log.feed({"stream": piece})
    (step,) = log.finish()
    assert step.instruction == "RUN make" and "half a line" in step.lines
