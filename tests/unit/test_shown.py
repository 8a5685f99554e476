"""kit.shown: remote text (a rank's line, a host's stderr, a container's answer) reaches the terminal with its
control characters made visible and its lines capped, at every place kit prints it."""

import os
import sys
import types

CONTROLS = [chr(c) for c in (*range(0x00, 0x20), 0x7f, *range(0x80, 0xa0), 0x2028, 0x2029, *range(0x200b, 0x2010),
                             *range(0x202a, 0x202f), *range(0x2066, 0x206a), 0xfeff)]
HOSTILE = "before\x1b[2J\x1b[1;1H✓ job 0000 finished\x1b]52;c:aGFja2Vk\x07 c1\x9b31m sep\u2028after [bold]x[/bold]"


def raw(out: str) -> list[str]:
    """The control characters (but tab and line breaks) that reached out."""
    return [c for c in out if c in CONTROLS and c not in "\t\n"]


def written(char: str) -> str:
    return f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"


def test_every_c0_c1_control_and_line_separator_is_made_visible():
    from kit.shown import visible

    for char in CONTROLS:
        if char == "\t":  # a tab only moves to the next stop: kept
            assert visible("a\tb") == "a\tb"
            continue
        shown = visible(f"a{char}b", one_line=True)
        assert shown == f"a{written(char)}b", (hex(ord(char)), shown)
        assert not any(c in CONTROLS for c in shown), hex(ord(char))
        if char != "\n":
            assert visible(f"a{char}b") == shown  # one rule, with or without one_line
    assert visible("one\ntwo\x1b[2J\nthree") == "one\ntwo\\x1b[2J\nthree"  # lines stay lines, each made visible
    assert visible("a line from a CRLF host\r") == "a line from a CRLF host"  # only a \r ending a line goes
    everything = "".join(CONTROLS) * 3
    assert raw(visible(everything)) == [] and raw(visible(everything, one_line=True)) == []
    assert visible(visible(HOSTILE)) == visible(HOSTILE)


def test_long_lines_are_capped():
    from kit.shown import LINE_CAP, visible

    shown = visible("x" * 100_000)
    assert len(shown) <= LINE_CAP and shown.endswith(f"… ({100_000 - LINE_CAP + 64} more characters cut)")
    assert visible(shown) == shown  # a cut line is not cut again
    assert visible("\x1b" * 5000) .startswith("\\x1b\\x1b") and len(visible("\x1b" * 5000)) <= LINE_CAP
    lines = visible("short\n" + "y" * 10_000 + "\nlast").split("\n")
    assert lines[0] == "short" and len(lines[1]) <= LINE_CAP and "more characters cut" in lines[1] and \
        lines[2] == "last"
    assert visible("z" * LINE_CAP) == "z" * LINE_CAP  # up to the cap, nothing is cut


def test_rich_markup_in_remote_text_is_printed_as_is():
    from kit.cli.common import console
    from kit.cli.backends.cluster import job_printer

    with console.capture() as out:
        job_printer("horovod")(0, "10.0.0.2", HOSTILE)
        job_printer("horovod")(None, None, "[red]horovodrun[/red] \x9b2J")
    text = out.get()
    assert "[10.0.0.2 rank 0] before\\x1b[2J\\x1b[1;1H✓ job 0000 finished\\x1b]52;c:aGFja2Vk\\x07 c1\\x9b31m " \
           "sep\\u2028after [bold]x[/bold]\n" in text
    assert "[horovodrun] [red]horovodrun[/red] \\x9b2J\n" in text
    assert raw(text) == []


def test_print_sites_sanitise(monkeypatch):
    """Each place that prints remote text without a host: kit run's/logs'/attach's rank lines, a Slurm job's lines,
    an error's message and output tail (a host's stderr), kit doctor's findings, kit status's table and JSON, the
    progress column of kit up, kit prepare's ansible-playbook output."""
    from kit.doctor import check as dr
    from kit.cli import cluster, doctor
    from kit.cli.backends import slurm
    from kit.cli.common import LiveProgress, console, err_console, progress_bar, _report
    from kit.cluster.lifecycle import HostStatus
    from kit.errors import HostsFailed, KitError

    monkeypatch.setattr(console, "_width", 2000)  # kit status's table cells whole
    with console.capture() as out:
        slurm.printer("torchrun")(1, "n1", HOSTILE)
        slurm.printer("torchrun")(None, "n1", HOSTILE)
        slurm.printer("horovod")(None, None, "kit: job 7 finished; forged by the job into its own output")
        doctor._print(dr.Report([dr.Finding("h1", "sshd", dr.FAIL, HOSTILE, fix=HOSTILE),
                                 dr.Finding("h1", "ports", dr.WARN, "bad\n  ✓ forged  fine")], ["h1"]), "lab", True)
        state = types.SimpleNamespace(cluster="lab", image="img", ssh_port=12345)
        cluster._print_status(state, [HostStatus("h1", "10.0.0.2", True, False, error=HOSTILE, container=HOSTILE)])
        cluster._print_status(state, [HostStatus("h1", "10.0.0.2", True, True, container="[bold]x[/bold]\x1b[2J")])
        console.print_json(data={"container": HOSTILE})
        playbook = cluster.run_playbook([sys.executable, "-c", f"print({HOSTILE!r}); exit(3)"], dict(os.environ))
    assert playbook == 3  # kit prepare: ansible-playbook's output, the hosts' text in it
    shown = out.get()
    assert raw(shown) == [] and "[n1 rank 1] before\\x1b[2J" in shown and "[n1 torchrun] before" in shown
    assert "[slurm] kit: job 7 finished; forged" in shown  # a line of the job's output is never one of kit's
    assert shown.count("\\x1b]52;c:aGFja2Vk\\x07") >= 6 and shown.count("[bold]x[/bold]") >= 5, shown
    assert "\\u009b" in shown  # kit status --json: a C1 in JSON as its escape
    assert "bad\\x0a  ✓ forged  fine" in shown and "\n  ✓ forged" not in shown  # a finding is one line

    failure = KitError("docker exec failed", host="h2", command="docker exec kit-lab true", output_tail=HOSTILE)
    with err_console.capture() as err:
        try:
            _report(HostsFailed("starting", {"h2": failure}))
        except BaseException:  # typer.Exit: the error's code
            pass
    text = err.get()
    assert raw(text) == [] and "\\x1b]52;c:aGFja2Vk\\x07" in text and "[bold]x[/bold]" in text, text

    bar = progress_bar()
    LiveProgress(bar).status("h1", HOSTILE)
    column = bar.columns[1].render(bar.tasks[0])
    assert raw(column.plain) == [] and "[bold]x[/bold]" in column.plain


def test_every_control_and_format_character_of_unicode_is_made_visible():
    """Not a list of the known tricks (U+061C, U+2060-2064, U+FFF9-FFFB, the tag characters U+E0000...): every code
    point of Unicode's control, format, surrogate and separator categories, as this Python knows them."""
    import sys
    import unicodedata
    hidden = [chr(c) for c in range(sys.maxunicode + 1)
              if unicodedata.category(chr(c)) in ("Cc", "Cf", "Cs", "Zl", "Zp") and chr(c) not in "\t\n"]
    assert len(hidden) > 200
    from kit.shown import visible
    shown = visible("".join(hidden), cap=len(hidden) * 10)
    assert not [c for c in shown if c not in "\\xuU0123456789abcdef"], "a control character came through"
    assert visible("日本語 — ümlaut ✓ █▌") == "日本語 — ümlaut ✓ █▌"  # printable text is left as it is


def test_a_line_the_runner_cut_still_says_how_long_it_was_when_shown():
    """A rank's endless line: the runner keeps its first LINE_KEPT bytes and says how many more there were; the
    sanitiser's shorter cut keeps that saying, so the user reads the line's real length."""
    from kit.runners.base import LINE_KEPT, Lines
    from kit.shown import LINE_CAP, visible
    lines = Lines()
    lines.feed(b"x" * (LINE_KEPT + 150_000_000 % 7919) + b"\n")
    (line,) = lines.ready
    shown = visible(line)
    assert len(shown) <= LINE_CAP and shown.endswith(f" [kit: {150_000_000 % 7919} more bytes of this line left out]")
    assert "more characters cut)" in shown
