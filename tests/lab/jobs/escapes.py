"""A job whose rank writes what would drive the user's terminal: clear the screen, move the cursor to print a fake
`✓ job finished`, write the clipboard (OSC 52), a C1 CSI, a line separator, Rich markup. It also writes the same
into its job folder's `hang` record (the job can write its folder), which the supervisor's record of the end replaces."""

import glob
import os

PAYLOAD = ("before\x1b[2J\x1b[1;1H✓ job 0000 finished\x1b]52;c:aGFja2Vk\x07 c1\x9b31m sep\u2028after "
           "[bold]x[/bold] bell\x07")

print(PAYLOAD, flush=True)
folders = glob.glob(f"/var/lib/kit/*/jobs/{os.environ.get('KIT_JOB', '')}")
try:
    with open(os.path.join(folders[0], "hang"), "w") as f:
        f.write(PAYLOAD)
    print("forged the hang record", flush=True)
except (OSError, IndexError) as e:
    print(f"cannot forge the hang record: {e}", flush=True)
