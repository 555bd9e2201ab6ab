#!/usr/bin/env python3
"""tests/layering.py: checks that cedar's folders include each other only
downward, as docs/architecture.md draws them.

What it is: a static check of the source tree, run by ctest (`layering` and
`layering_selftest`) from the repository root with any python3 (standard
library only). It reads every .c/.h/.cu/.cuh under the layered folders (not
tests/), collects the `#include "folder/file.h"` lines and fails, printing
file:line, the rule and how to fix it, when

  arrow    an include runs against the allowed table below,
  cycle    folders include each other in a circle,
  missing  an include names a file that does not exist,
  path     a cedar header is named relative to the including file,
  cmake    the top-level CMakeLists.txt links a cedar_<folder> library to
           other cedar_* libraries than the table allows,
  size     a source file is over MAX_LINES lines,
  function a function is over MAX_FUNC_LINES lines (its opening line to its
           closing brace),
  header   a source file does not open with a comment,
  dot      docs/architecture-includes.dot is not what --dot prints now.

What it is not: a compiler. It does not follow #if, macros or includes
inside comments that start a line with `#`; the per-folder libraries (one
CMake library per folder) catch at link time what a text scan misses.

Usage:
  python3 tests/layering.py              check the tree (exit 0 clean, 1 not)
  python3 tests/layering.py --dot        print the folder include graph (DOT)
  python3 tests/layering.py --selftest   prove each rule can fail, on small
                                         temporary trees
  --root DIR                             check or draw another tree
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

# The allowed arrows: folder -> folders whose headers it may include (itself
# always allowed). The only copy of the table; docs/architecture.md explains
# it and CMakeLists.txt's target_link_libraries lines must equal it.
ALLOWED = {
    # Error tiers, allocation and logging: used by everything, so they can
    # use nothing of cedar.
    "base": set(),
    # CPU reference ops take pointers and dimensions; they need only the
    # foundation's status codes, allocation and logging.
    "ops": {"base"},
    # CUDA twins of the ops: the same signatures and the shared
    # __host__ __device__ rules (codecs, scales), so they see ops/.
    "kernels": {"ops", "base"},
    # Plans and the graph compiler: a plan's layers are sized by the ops'
    # shapes and formats (ops/), and report errors through base/.
    "scheduler": {"ops", "base"},
    # Exporters draw plans and graphs (scheduler/) and traces; they run
    # nothing, so they never see the runtime.
    "viz": {"scheduler", "base"},
    # ---- runtime/: the engine, one floor per sub-folder ---------------------
    # Text: the tokenizer, the chat template, streamed text. Nothing of the
    # model: a tokenizer is loaded and tested alone.
    "runtime/text": {"base"},
    # Loading: safetensors, weights, released checkpoints (plans size them).
    "runtime/load": {"scheduler", "ops", "base"},
    # The model: op groups over weights, request state, arena, Engram map
    # and tier, the DSpark drafter's math, rounding traces.
    "runtime/model": {"runtime/load", "runtime/text", "scheduler", "ops", "base"},
    # The prefix cache and its disk tier: blocks of request state.
    "runtime/cache": {"runtime/model", "runtime/load", "scheduler", "ops", "base"},
    # Rank messaging (StarPU-MPI) and the NCCL transport: bytes between
    # ranks and devices, nothing of the model.
    "runtime/comm": {"base"},
    # Node dispatch: the backend table (features and devices register their
    # entries), binding a node's state, the CPU op-group entries.
    "runtime/node": {"runtime/model", "scheduler", "ops", "base"},
    # The device home: device state, slot tables, CUDA graphs, the CUDA
    # op-group entries (registered into the node table).
    "runtime/device": {"runtime/node", "runtime/model", "runtime/load", "scheduler", "kernels", "ops", "base"},
    # Executors: the direct and the StarPU one, decode segments.
    "runtime/exec": {"runtime/device", "runtime/node", "runtime/model", "scheduler", "ops", "base"},
    # Generation: one request's prefill and decode loop, the sampler path.
    "runtime/gen": {"runtime/exec", "runtime/node", "runtime/cache", "runtime/model", "scheduler", "ops", "base"},
    # Distribution: P/D, layer stages, expert parallel, per-rank accounting.
    "runtime/dist": {"runtime/gen", "runtime/exec", "runtime/device", "runtime/node", "runtime/comm",
                     "runtime/cache", "runtime/model", "runtime/load", "scheduler", "kernels", "ops", "base"},
    # The engine: opens everything a plan needs and chooses the driver;
    # batching and speculation.
    "runtime/engine": {"runtime/dist", "runtime/gen", "runtime/exec", "runtime/device", "runtime/node",
                       "runtime/comm", "runtime/cache", "runtime/model", "runtime/load", "runtime/text",
                       "scheduler", "kernels", "ops", "base"},
    # The HTTP server (cedar serve): drives the engine's batching loop from
    # its own thread, turns ids into text; never an op, a kernel or a node.
    "serve": {"runtime/engine", "runtime/text", "base"},
    # The binary's commands parse, call the engine and print: the top, the
    # only folder allowed to see everything.
    "cli": {"serve", "runtime/engine", "runtime/dist", "runtime/gen", "runtime/exec", "runtime/device",
            "runtime/node", "runtime/comm", "runtime/cache", "runtime/model", "runtime/load",
            "runtime/text", "viz", "scheduler", "kernels", "ops", "base"},
}
# Bottom-up: the order folders are listed and drawn in.
FOLDERS = ["base", "ops", "kernels", "scheduler", "viz", "runtime/text", "runtime/load",
           "runtime/model", "runtime/cache", "runtime/comm", "runtime/node", "runtime/device",
           "runtime/exec", "runtime/gen", "runtime/dist", "runtime/engine", "serve", "cli"]
# The top-level names an include may start with to name a layered folder.
TOPS = sorted({f.split("/")[0] for f in FOLDERS})
SOURCE_EXTS = (".c", ".h", ".cu", ".cuh")
MAX_LINES = 800
MAX_FUNC_LINES = 120
DOT_PATH = "docs/architecture-includes.dot"
SVG_PATH = "docs/architecture-includes.svg"
REGEN = ("python3 tests/layering.py --dot > " + DOT_PATH +
         " && dot -Tsvg " + DOT_PATH + " -o " + SVG_PATH)

INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]')


def folder_of(rel):
    """The layered folder a path (relative to the root, / separated) is in:
    the longest folder of FOLDERS it lies under, or None."""
    best = None
    for f in FOLDERS:
        if rel.startswith(f + "/") and (best is None or len(f) > len(best)):
            best = f
    return best


def lib_of(folder):
    """The CMake library of a folder: cedar_ and its path with _ for /."""
    return "cedar_" + folder.replace("/", "_")


assert set(ALLOWED) == set(FOLDERS)


class Problem:
    def __init__(self, where, rule, message, fix):
        self.where, self.rule, self.message, self.fix = where, rule, message, fix

    def __str__(self):
        return "%s: [%s] %s\n    fix: %s" % (self.where, self.rule,
                                              self.message, self.fix)


def source_files(root):
    """Every layered source file, as a path relative to root, sorted."""
    out = []
    for folder in TOPS:
        top = os.path.join(root, folder)
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames.sort()
            for name in sorted(filenames):
                if name.endswith(SOURCE_EXTS):
                    out.append(os.path.relpath(os.path.join(dirpath, name), root))
    return out


def read_lines(root, rel):
    with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
        return f.read().splitlines()


def scan_includes(root, files):
    """(file, line, name, from folder, to folder or None, problem or None)
    for every #include of a cedar header (quoted, or angled but naming a
    layered folder)."""
    out = []
    for rel in files:
        src = folder_of(rel.replace(os.sep, "/"))
        for n, line in enumerate(read_lines(root, rel), 1):
            m = INCLUDE_RE.match(line)
            if not m:
                continue
            quote, name = m.group(1), m.group(2).strip()
            norm = os.path.normpath(name)
            first = norm.split(os.sep)[0]
            if quote == "<" and first not in TOPS:
                continue  # a system or library header
            where = "%s:%d" % (rel, n)
            if first in TOPS:
                problem = None
                dst = folder_of(norm.replace(os.sep, "/"))
                if not os.path.isfile(os.path.join(root, norm)):
                    problem = Problem(
                        where, "missing",
                        '#include "%s": no file %s in the tree' % (name, norm),
                        "fix the name (headers are named from the repository root, "
                        '"folder/file.h") or add the header')
                elif dst is None:
                    problem = Problem(
                        where, "arrow",
                        '#include "%s": %s is in no layered folder' % (name, os.path.dirname(norm)),
                        "move the header into one of the folders of tests/layering.py's FOLDERS")
                out.append((rel, n, name, src, dst, problem))
            elif os.path.isfile(os.path.join(root, norm)):
                out.append((rel, n, name, src, None, Problem(
                    where, "arrow",
                    '#include "%s": %s/ is not a layered folder; %s/ may include '
                    "only %s" % (name, first, src, describe(ALLOWED[src] | {src})),
                    "move the code it needs into one of those folders "
                    "(base/ if every folder needs it), or pass the value in")))
            elif os.path.isfile(os.path.join(root, os.path.dirname(rel), norm)):
                out.append((rel, n, name, src, None, Problem(
                    where, "path",
                    '#include "%s" is named relative to the including file' % name,
                    'name it from the repository root: "%s"' % os.path.normpath(
                        os.path.join(os.path.dirname(rel), norm)))))
            else:
                out.append((rel, n, name, src, None, Problem(
                    where, "missing", '#include "%s": no such file' % name,
                    "fix the name (headers are named from the repository root, "
                    '"folder/file.h") or add the header')))
    return out


def describe(folders):
    folders = [f for f in FOLDERS if f in folders]
    return ", ".join(f + "/" for f in folders) if folders else "nothing of cedar"


def edge_counts(includes):
    """{(from, to): number of include lines} between different folders."""
    counts = {}
    for _rel, _n, _name, src, dst, _p in includes:
        if dst is not None and dst != src:
            counts[(src, dst)] = counts.get((src, dst), 0) + 1
    return counts


def check_arrows(includes):
    out = []
    for rel, n, name, src, dst, problem in includes:
        if problem is not None:
            out.append(problem)
        if src is None or dst is None or dst == src or dst in ALLOWED[src]:
            continue
        out.append(Problem(
            "%s:%d" % (rel, n), "arrow",
            '#include "%s": %s/ may not include %s/ (%s/ may include only %s)'
            % (name, src, dst, src, describe(ALLOWED[src] | {src})),
            "move the code %s/ needs from %s/ down to a folder %s/ may include "
            "(base/ if every folder needs it), or pass the value in from the "
            "caller" % (src, dst, src)))
    return out


def strong_groups(nodes, graph):
    """The strongly connected groups of more than one node (Tarjan), each a
    set; graph maps a node to the nodes it points at, in a fixed order."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def strongconnect(v):  # a few hundred nodes at most: recursion is fine
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(set(group))

    for v in nodes:
        if v not in index:
            strongconnect(v)
    return groups


def find_cycles(counts):
    """Strongly connected groups of folders, each as one cycle path."""
    graph = {f: sorted({d for (s, d) in counts if s == f}, key=FOLDERS.index)
             for f in FOLDERS}
    groups = strong_groups(FOLDERS, graph)
    cycles = []
    for group in groups:
        start = min(group, key=FOLDERS.index)
        # Breadth-first inside the group from start back to start.
        prev, frontier = {}, [start]
        while frontier and start not in prev:
            nxt = []
            for v in frontier:
                for w in graph[v]:
                    if w in group and w not in prev:
                        prev[w] = v
                        nxt.append(w)
            frontier = nxt
        path, v = [start], prev[start]
        while v != start:
            path.append(v)
            v = prev[v]
        path.append(start)
        cycles.append(list(reversed(path)))
    return cycles


def check_cycles(includes, counts):
    out = []
    first_line = {}
    for rel, n, _name, src, dst, _p in includes:
        if dst is not None and dst != src:
            first_line.setdefault((src, dst), "%s:%d" % (rel, n))
    for cycle in find_cycles(counts):
        steps = ["%s -> %s (%s)" % (a, b, first_line[(a, b)])
                 for a, b in zip(cycle, cycle[1:])]
        out.append(Problem(
            first_line[(cycle[0], cycle[1])], "cycle",
            "folders include each other in a circle: %s; %s"
            % (" -> ".join(cycle), "; ".join(steps)),
            "break one arrow of the circle: move the code both sides need "
            "down below both folders, or pass the value in"))
    return out


def module_of(rel):
    """A file's module: its path without the extension, an _internal or
    _impl header counted with the files it serves (x_internal.h with x)."""
    stem = os.path.splitext(rel.replace(os.sep, "/"))[0]
    for suffix in ("_internal", "_impl"):
        if stem.endswith(suffix):
            return stem[:-len(suffix)]
    return stem


def check_file_cycles(includes):
    """Modules (a .c with its .h) of one folder that include each other in
    a circle: each folder's files must form a one-way order too."""
    graph, first_line = {}, {}
    for rel, n, name, src, dst, _p in includes:
        if src is None or src != dst:
            continue
        a, b = module_of(rel), module_of(os.path.normpath(name))
        if a == b:
            continue
        graph.setdefault(a, set()).add(b)
        first_line.setdefault((a, b), "%s:%d" % (rel, n))
    out = []
    for group in strong_groups(sorted(graph), {v: sorted(ws) for v, ws in graph.items()}):
        group = sorted(group)
        steps = ["%s -> %s (%s)" % (a, b, first_line[(a, b)])
                 for a in group for b in sorted(graph.get(a, ())) if b in group]
        out.append(Problem(
            first_line[(group[0], sorted(b for b in graph[group[0]] if b in group)[0])],
            "filecycle", "files of one folder include each other in a circle: %s; %s"
            % (", ".join(group), "; ".join(steps)),
            "break one include: move what both need into a third file both include, "
            "or pass the value in"))
    return out


def strip_cmake_comments(text):
    """CMake text with # comments blanked (lines kept, quotes respected)."""
    out_lines = []
    for line in text.split("\n"):
        quoted, cut = False, len(line)
        for i, ch in enumerate(line):
            if ch == '"' and (i == 0 or line[i - 1] != "\\"):
                quoted = not quoted
            elif ch == "#" and not quoted:
                cut = i
                break
        out_lines.append(line[:cut])
    return "\n".join(out_lines)


def cmake_links(root):
    """{folder: (cedar_* folders linked, first line)} from the top-level
    CMakeLists.txt's target_link_libraries(cedar_<folder> ...) calls."""
    with open(os.path.join(root, "CMakeLists.txt"), encoding="utf-8") as f:
        text = strip_cmake_comments(f.read())
    links = {}
    for m in re.finditer(r"\btarget_link_libraries\s*\(", text, re.IGNORECASE):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        args = text[m.end():i - 1].split()
        if not args:
            continue
        by_lib = {lib_of(f): f for f in FOLDERS}
        folder = by_lib.get(args[0])
        if folder is None:
            continue
        deps = set()
        for arg in args[1:]:
            for name in re.findall(r"\bcedar_[a-z_]+\b", arg):
                if name in by_lib and by_lib[name] != folder:
                    deps.add(by_lib[name])
        line = text.count("\n", 0, m.start()) + 1
        old = links.get(folder, (set(), line))
        links[folder] = (old[0] | deps, old[1])
    return links


def check_cmake(root, files):
    out = []
    try:
        links = cmake_links(root)
    except OSError as e:
        return [Problem("CMakeLists.txt", "cmake", "cannot read: %s" % e,
                        "run from the repository root, or pass --root")]
    present = {folder_of(rel.replace(os.sep, "/")) for rel in files}
    for folder in FOLDERS:
        want = ALLOWED[folder]
        if folder not in links:
            if want and folder in present:
                out.append(Problem(
                    "CMakeLists.txt", "cmake",
                    "no target_link_libraries(%s ...) call" % lib_of(folder),
                    "add target_link_libraries(%s PUBLIC %s)"
                    % (lib_of(folder), " ".join(lib_of(f) for f in FOLDERS if f in want))))
            continue
        have, line = links[folder]
        if have == want:
            continue
        extra = [f for f in FOLDERS if f in have - want]
        lacking = [f for f in FOLDERS if f in want - have]
        parts = []
        if extra:
            parts.append("links %s, which the table does not allow"
                         % ", ".join(lib_of(f) for f in extra))
        if lacking:
            parts.append("does not link %s, which the table allows"
                         % ", ".join(lib_of(f) for f in lacking))
        out.append(Problem(
            "CMakeLists.txt:%d" % line, "cmake",
            "%s %s" % (lib_of(folder), "; ".join(parts)),
            "link exactly the allowed arrows: target_link_libraries(%s "
            "PUBLIC %s ...); code that needs another folder moves down, or "
            "takes the value as an argument" % (
                lib_of(folder), " ".join(lib_of(f) for f in FOLDERS if f in want))))
    return out


def check_files(root, files):
    out = []
    for rel in files:
        if folder_of(rel.replace(os.sep, "/")) is None:
            out.append(Problem(
                "%s:1" % rel, "folder",
                "the file is in no layered folder (runtime/ holds only its sub-folders)",
                "move it into the sub-folder of its concern (tests/layering.py FOLDERS)"))
    for rel in files:
        lines = read_lines(root, rel)
        if len(lines) > MAX_LINES:
            out.append(Problem(
                "%s:%d" % (rel, MAX_LINES + 1), "size",
                "%d lines, over the %d-line limit for non-test files"
                % (len(lines), MAX_LINES),
                "split it by flow into two files (its room in the house is "
                "probably two rooms)"))
        if not lines or not lines[0].lstrip().startswith(("/*", "//")):
            out.append(Problem(
                "%s:1" % rel, "header",
                "the file does not open with a comment",
                "start it with a short comment: what it is, what it is not, "
                "how it is tested"))
    return out


FUNC_OPEN_RE = re.compile(r"^[A-Za-z_][^;{}]*\)\s*(const\s*)?\{\s*$")
FUNC_NAME_RE = re.compile(r"([A-Za-z_][A-Za-z_0-9]*)\s*\(")


def strip_code(line):
    """A line with string and character literals emptied and // comments cut
    (block comments are handled by the caller)."""
    line = re.sub(r'"(\\.|[^"\\])*"', '""', line)
    line = re.sub(r"'(\\.|[^'\\])*'", "''", line)
    return line.split("//", 1)[0]


def long_functions(lines):
    """(first line, lines, name) of each top-level function body: a line at
    brace depth 0 that ends a signature with `{`, to the brace that closes
    it. Block comments, strings and preprocessor lines do not count."""
    out, depth, start, name, in_comment, sig = [], 0, None, None, False, []
    for i, raw in enumerate(lines):
        line = raw
        if in_comment:
            if "*/" not in line:
                continue
            line, in_comment = line.split("*/", 1)[1], False
        while "/*" in line:
            head, rest = line.split("/*", 1)
            if "*/" in rest:
                line = head + " " + rest.split("*/", 1)[1]
            else:
                line, in_comment = head, True
        code = strip_code(line)
        if code.lstrip().startswith("#"):
            continue
        if depth == 0:
            sig = (sig + [code])[-4:]
            joined = " ".join(x.strip() for x in sig)
            if code.rstrip().endswith("{") and FUNC_OPEN_RE.match(joined.strip()) and "=" not in joined.split("(")[0]:
                m = FUNC_NAME_RE.search(joined)
                first = i - len([x for x in sig[:-1] if x.strip()])
                while first < i and not lines[first].strip():
                    first += 1
                start, name = first, m.group(1) if m else "?"
        for ch in code:
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0 and start is not None:
                    out.append((start + 1, i - start + 1, name))
                    start = None
        if depth == 0 and code.strip().endswith((";", "}")):
            sig = []
    return out


def check_functions(root, files):
    out = []
    for rel in files:
        if not rel.endswith((".c", ".cu")):
            continue
        for first, n, name in long_functions(read_lines(root, rel)):
            if n > MAX_FUNC_LINES:
                out.append(Problem(
                    "%s:%d" % (rel, first), "function",
                    "%s() is %d lines, over the %d-line limit" % (name, n, MAX_FUNC_LINES),
                    "split it by step: each step a static function with its own name"))
    return out


def render_dot(root):
    """The folder include graph as Graphviz DOT."""
    files = source_files(root)
    counts = edge_counts(scan_includes(root, files))
    out = [
        "// docs/architecture-includes.dot: cedar's folder include graph, one",
        "// node per folder, one edge per folder pair labelled with its number",
        "// of #include lines. Generated by `python3 tests/layering.py --dot`",
        "// from the sources; the layering test fails when it is stale.",
        "// Regenerate: " + REGEN,
        "digraph cedar_includes {",
        "  // A folder sits above the folders it includes, so base/ is at the",
        "  // bottom; an edge not in the allowed table would be drawn red.",
        "  rankdir=TB;",
        '  node [shape=box, style="rounded,filled", fillcolor="#eef3f8", '
        'fontname="Helvetica"];',
        '  edge [fontname="Helvetica", fontsize=10];',
    ]
    for f in reversed(FOLDERS):
        out.append('  "%s" [label="%s/"];' % (f, f))
    out.append('  { rank=sink; "base"; }')
    for src in reversed(FOLDERS):
        for dst in reversed(FOLDERS):
            n = counts.get((src, dst))
            if n is None:
                continue
            if dst in ALLOWED[src]:
                out.append('  "%s" -> "%s" [label="%d"];' % (src, dst, n))
            else:
                out.append('  "%s" -> "%s" [label="%d (not allowed)", '
                           'color=red, fontcolor=red];' % (src, dst, n))
    out.append("}")
    return "\n".join(out) + "\n"


def check_dot(root):
    path = os.path.join(root, DOT_PATH)
    try:
        with open(path, encoding="utf-8") as f:
            committed = f.read()
    except OSError:
        committed = None
    now = render_dot(root)
    if committed == now:
        return []
    if committed is None:
        what = "missing"
    else:
        what = "differs from what `tests/layering.py --dot` prints for the tree now"
        edge = re.compile(r'^\s*"(\w+)" -> "(\w+)" \[label="(\d+)')
        def edges(text):
            return {m.group(1) + " -> " + m.group(2): m.group(3)
                    for m in map(edge.match, text.splitlines()) if m}
        old, new = edges(committed), edges(now)
        changes = ["%s: %s -> %s include lines" % (k, old.get(k, "0"), new.get(k, "0"))
                   for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
        if changes:
            what += " (" + "; ".join(changes) + ")"
    return [Problem(DOT_PATH, "dot", what, "regenerate it and its picture: " + REGEN)]


def check(root, dot=True):
    files = source_files(root)
    includes = scan_includes(root, files)
    counts = edge_counts(includes)
    problems = (check_arrows(includes) + check_cycles(includes, counts) + check_file_cycles(includes) +
                check_cmake(root, files) + check_files(root, files) + check_functions(root, files) +
                (check_dot(root) if dot else []))
    return files, counts, problems


def run_check(root, dot=True):
    files, counts, problems = check(root, dot)
    for p in problems:
        print(p)
    if problems:
        print("layering: FAILED: %d problem(s) in %d files (allowed table: "
              "tests/layering.py ALLOWED; docs/architecture.md)"
              % (len(problems), len(files)))
        return 1
    print("layering: ok: %d files, %d cross-folder include lines, no upward "
          "include, no cycle, CMake links match" % (len(files), sum(counts.values())))
    return 0


# ---- self test: each rule on a small temporary tree --------------------------

def write_tree(root, files):
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)


def clean_tree():
    """A tree that passes: one header per folder, a chain of allowed
    includes, CMake links equal to the table."""
    def src(comment, *includes):
        return "/* %s */\n" % comment + "".join('#include "%s"\n' % i for i in includes)
    cmake = ["# test tree"]
    for f in FOLDERS:
        cmake.append("cedar_folder_library(%s %s)" % (lib_of(f), f))
        deps = " ".join(lib_of(d) for d in FOLDERS if d in ALLOWED[f])
        cmake.append("target_link_libraries(%s PUBLIC %s m)  # cedar_viz" % (lib_of(f), deps))
    return {
        "CMakeLists.txt": "\n".join(cmake) + "\n",
        "base/b.h": src("b.h: base"),
        "ops/o.h": src("o.h: ops", "base/b.h"),
        "ops/o.c": "// o.c: ops\n/* a comment line is not an include:\n"
                   ' * #include "runtime/engine/r.h"\n */\n#include <stdio.h>\n#include "ops/o.h"\n',
        "kernels/k.cuh": src("k.cuh: kernels", "ops/o.h"),
        "scheduler/s.h": src("s.h: scheduler", "ops/o.h", "base/b.h"),
        "runtime/engine/r.h": src("r.h: runtime/engine", "scheduler/s.h", "runtime/engine/q.h"),
        "runtime/engine/q.h": src("q.h: runtime/engine", "runtime/model/m.h"),
        "runtime/model/m.h": src("m.h: runtime/model", "scheduler/s.h"),
        "viz/v.c": src("v.c: viz", "scheduler/s.h"),
        "cli/c.c": src("c.c: cli", "runtime/engine/r.h", "viz/v.c", "kernels/k.cuh"),
        "scheduler/limit.c": "// exactly at the limit\n" + "\n" * (MAX_LINES - 1),
        "tests/t.c": '#include "cli/c.c"\n' + "\n" * (2 * MAX_LINES),
    }


def selftest():
    cases = [
        # (name, edits to the clean tree, rules expected, text expected)
        ("clean", {}, set(), None),
        ("upward", {"kernels/k.cuh": '/* k */\n#include "runtime/engine/r.h"\n'},
         {"arrow"}, "kernels/k.cuh:2"),
        ("cycle", {"base/b.h": '/* b */\n#include "ops/o.h"\n'},
         {"arrow", "cycle"}, "base -> ops -> base"),
        ("missing", {"runtime/engine/m.c": '/* m */\n#include "ops/absent.h"\n'},
         {"missing"}, "runtime/engine/m.c:2"),
        ("sub up", {"runtime/model/m.h": '/* m */\n#include "runtime/engine/r.h"\n'},
         {"arrow", "cycle"}, "runtime/model -> runtime/engine"),
        ("no floor", {"runtime/x.c": '/* x */\n#include "ops/o.h"\n'},
         {"folder"}, "runtime/x.c:1"),
        ("file cycle", {"runtime/engine/q.h": '/* q */\n#include "runtime/engine/r.h"\n'},
         {"filecycle"}, "runtime/engine/q, runtime/engine/r"),
        ("relative", {"ops/p.c": '/* p */\n#include "o.h"\n'},
         {"path"}, '"ops/o.h"'),
        ("outside", {"viz/w.c": '/* w */\n#include "tests/t.c"\n'},
         {"arrow"}, "viz/w.c:2"),
        ("oversize", {"scheduler/big.c": "/* big */\n" + "\n" * MAX_LINES},
         {"size"}, "scheduler/big.c:%d" % (MAX_LINES + 1)),
        ("long function", {"ops/f.c": "/* f */\nint f(int a,\n      int b) {\n" + "  a++;\n" * MAX_FUNC_LINES +
                           "  return a;\n}\nstatic int g(void) { return 0; }\n"},
         {"function"}, "ops/f.c:2: [function] f() is %d lines" % (MAX_FUNC_LINES + 4)),
        ("no header", {"viz/v.c": '#include "scheduler/s.h"\n'},
         {"header"}, "viz/v.c:1"),
        ("cmake", {"CMakeLists.txt": "target_link_libraries(cedar_ops PUBLIC m)\n"
                   "target_link_libraries(cedar_viz PUBLIC cedar_scheduler\n"
                   "  cedar_base)\n"
                   "if(X)\n  target_link_libraries(cedar_viz PUBLIC cedar_runtime_engine)\nendif()\n"},
         {"cmake"}, "cedar_viz links cedar_runtime_engine"),
    ]
    failures = 0
    for name, edits, want_rules, want_text in cases:
        with tempfile.TemporaryDirectory(prefix="cedar-layering-") as root:
            tree = clean_tree()
            tree.update(edits)
            write_tree(root, tree)
            write_tree(root, {DOT_PATH: render_dot(root)})
            _files, _counts, problems = check(root)
            got = {p.rule for p in problems}
            text = "\n".join(str(p) for p in problems)
            ok = got == want_rules and (want_text is None or want_text in text)
            if name == "cmake":  # both directions of the mismatch are named
                ok = ok and "cedar_ops does not link cedar_base" in text
            if name == "clean":
                dot = render_dot(root)
                ok = ok and '"ops" -> "base" [label="1"];' in dot \
                    and '"scheduler" -> "base" [label="1"];' in dot
            print("selftest %-10s %s" % (name, "ok" if ok else "FAILED"))
            if not ok:
                print("  expected rules %s%s, got %s:\n%s" % (
                    sorted(want_rules), " with %r" % want_text if want_text else "",
                    sorted(got), text))
                failures += 1
    # The stale picture, and the exit status the ctest sees.
    with tempfile.TemporaryDirectory(prefix="cedar-layering-") as root:
        write_tree(root, clean_tree())
        write_tree(root, {DOT_PATH: render_dot(root)})
        clean_rc = subprocess.call([sys.executable, __file__, "--root", root],
                                   stdout=subprocess.DEVNULL)
        write_tree(root, {"cli/d.c": '/* d */\n#include "ops/o.h"\n'})
        _f, _c, problems = check(root)
        stale_ok = [p.rule for p in problems] == ["dot"] and "--dot >" in problems[0].fix \
            and "cli -> ops: 0 -> 1 include lines" in problems[0].message
        stale_rc = subprocess.call([sys.executable, __file__, "--root", root],
                                   stdout=subprocess.DEVNULL)
        ok = stale_ok and clean_rc == 0 and stale_rc == 1
        print("selftest %-10s %s" % ("stale dot", "ok" if ok else "FAILED"))
        if not ok:
            print("  stale dot reported: %s; exit status clean %d (want 0), "
                  "stale %d (want 1)" % (stale_ok, clean_rc, stale_rc))
            failures += 1
    print("layering selftest: %s" % ("ok" if not failures else
                                     "FAILED (%d case(s))" % failures))
    return 1 if failures else 0


def main():
    ap = argparse.ArgumentParser(description="Check cedar's folder layering.")
    ap.add_argument("--root", default=".", help="repository root (default: .)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--dot", action="store_true",
                      help="print the folder include graph as Graphviz DOT")
    mode.add_argument("--selftest", action="store_true",
                      help="check the checker on small temporary trees")
    ap.add_argument("--no-dot", action="store_true",
                    help="skip the picture's staleness (the build's check; ctest checks it)")
    args = ap.parse_args()
    if args.selftest:
        return selftest()
    root = os.path.abspath(args.root)
    if not os.path.isfile(os.path.join(root, "CMakeLists.txt")):
        print("layering: %s has no CMakeLists.txt; run from the repository "
              "root or pass --root" % root, file=sys.stderr)
        return 2
    if args.dot:
        sys.stdout.write(render_dot(root))
        return 0
    return run_check(root, dot=not args.no_dot)


if __name__ == "__main__":
    sys.exit(main())
