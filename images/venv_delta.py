"""What installing kit's tools and the user's extra packages changed in the image's venv (run by kit's image build).

    python venv_delta.py snapshot /opt/venv BEFORE                # before the installs
    python venv_delta.py delta /opt/venv BEFORE DEST REMOVED      # after them

`delta` copies each file or link that is new or changed (size, mtime, mode or
link target) under DEST, as laid out in the venv, and lists in REMOVED what is
gone or became another kind of thing (a folder that is now a link...), only the
topmost of each. The final image removes what REMOVED lists from torch's venv,
then copies DEST over it: the same venv as installing there, but in layers of
its own on top, so a change of the extra packages changes only those (and `kit
up` sends only those to the hosts).
"""

import json
import os
import shutil
import sys

def entries(root):
    """Relative path -> what identifies its content, for every file, link and folder under root."""
    found = {}
    for folder, dirs, names in os.walk(root):
        for name in dirs + names:
            path = os.path.join(folder, name)
            st = os.lstat(path)
            kind = "l" if os.path.islink(path) else "d" if os.path.isdir(path) else "f"
            key = [kind, st.st_mode]
            if kind == "l":
                key.append(os.readlink(path))
            elif kind == "f":
                key += [st.st_size, st.st_mtime_ns]
            found[os.path.relpath(path, root)] = key
    return found


def topmost(paths):
    """The paths none of whose folders is among them (removing those removes the rest)."""
    chosen = set()
    for rel in sorted(paths):
        parts = rel.split(os.sep)
        if not any(os.sep.join(parts[:i]) in chosen for i in range(1, len(parts))):
            chosen.add(rel)
    return sorted(chosen)


def delta(root, before, dest, removed):
    now = entries(root)
    os.makedirs(dest, exist_ok=True)
    changed = 0
    for rel, key in sorted(now.items()):
        if before.get(rel) == key:
            continue
        source, target = os.path.join(root, rel), os.path.join(dest, rel)
        if key[0] == "d":
            os.makedirs(target, exist_ok=True)
            shutil.copystat(source, target)
            continue
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if key[0] == "l":
            os.symlink(os.readlink(source), target)
        else:
            shutil.copy2(source, target)
        changed += 1
    gone = topmost(rel for rel, key in before.items() if rel not in now or now[rel][0] != key[0])
    with open(removed, "w") as f:
        f.write("".join(rel + "\n" for rel in gone))
    print("venv_delta: %d files new or changed, %d gone or replaced" % (changed, len(gone)))


def main():
    if sys.argv[1] == "snapshot":
        with open(sys.argv[3], "w") as f:
            json.dump(entries(sys.argv[2]), f)
    elif sys.argv[1] == "delta":
        with open(sys.argv[3]) as f:
            delta(sys.argv[2], json.load(f), sys.argv[4], sys.argv[5])
    else:
        sys.exit("usage: venv_delta.py snapshot ROOT OUT | delta ROOT SNAPSHOT DEST REMOVED")


if __name__ == "__main__":
    main()
