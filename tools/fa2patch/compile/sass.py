# SPDX-License-Identifier: BSD-3-Clause
"""Read what the compiler made: ptxas -v logs, cuobjdump resource usage and SASS listings (text
in, dataclasses out: toolchain.cuobjdump and toolchain.demangle run the tools); and the one way
kernel names are matched (``kernel_matches``).

Used by `verify` (budgets, tensor-core checks, launch configurations) and `report` (loop mixes,
operands of loads).
"""

import fnmatch
import re
from dataclasses import dataclass, field


@dataclass
class PtxasEntry:
    name: str
    arch: str = ""
    entry: bool = False
    registers: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    stack: int = 0
    smem: int = 0


_COMPILING = re.compile(r"Compiling entry function '([^']+)' for '(sm_\w+)'")
_PROPS = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(.*)")
_SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas_log(text: str) -> dict[str, PtxasEntry]:
    """Per-function numbers from ``ptxas -v`` output (nvcc -Xptxas -v, clang -Xcuda-ptxas -v)."""
    entries: dict[str, PtxasEntry] = {}
    current = None
    for line in text.splitlines():
        if m := _COMPILING.search(line):
            current = entries.setdefault(m.group(1), PtxasEntry(m.group(1)))
            current.arch, current.entry = m.group(2), True
        elif m := _PROPS.search(line):
            current = entries.setdefault(m.group(1), PtxasEntry(m.group(1)))
        elif current is not None and (m := _FRAME.search(line)):
            current.stack, current.spill_stores, current.spill_loads = map(int, m.groups())
        elif current is not None and (m := _USED.search(line)):
            current.registers = int(m.group(1))
            if s := _SMEM.search(m.group(2)):
                current.smem = int(s.group(1))
    return entries


@dataclass
class Resources:
    name: str
    arch: str
    registers: int
    stack: int
    shared: int
    local: int


_ARCH = re.compile(r"^arch = (sm_\w+)", re.M)
_FUNC_RES = re.compile(r"^\s*Function (\S+):\s*\n\s*(.*)$", re.M)


def parse_resource_usage(text: str) -> list[Resources]:
    """Per-kernel numbers from ``cuobjdump --dump-resource-usage``."""
    out = []
    # Each ELF section starts with "arch = sm_XX"; kernels below it belong to that arch.
    sections = re.split(r"(?=^arch = sm_)", text, flags=re.M)
    for section in sections:
        arch_m = _ARCH.search(section)
        if not arch_m:
            continue
        for m in _FUNC_RES.finditer(section):
            fields = dict(re.findall(r"([A-Z_]+(?:\[\d+\])?):(\d+)", m.group(2)))
            out.append(
                Resources(
                    m.group(1),
                    arch_m.group(1),
                    int(fields.get("REG", 0)),
                    int(fields.get("STACK", 0)),
                    int(fields.get("SHARED", 0)),
                    int(fields.get("LOCAL", 0)),
                )
            )
    return out


_REGISTER = re.compile(r"\bR(\d+)\b")


@dataclass
class Instr:
    addr: int
    op: str  # opcode with modifiers, without the predicate
    target: int | None = None  # branch target of a BRA
    args: str = ""  # operands as written
    predicated: bool = False  # guarded by a predicate (@P0, @!P1, ...): may not run

    @property
    def registers(self) -> set[int]:
        """Numbers of the general registers its operands name (RZ excluded)."""
        return {int(r) for r in _REGISTER.findall(self.args)}

    def loaded_registers(self) -> set[int]:
        """Registers a load writes: its first operand and, for 64/128-bit loads, the next ones."""
        first = _REGISTER.search(self.args.split(",")[0])
        if first is None:
            return set()
        width = 4 if ".128" in self.op else 2 if ".64" in self.op else 1
        return set(range(int(first.group(1)), int(first.group(1)) + width))


@dataclass
class Loop:
    start: int
    end: int  # address of the back-edge branch
    instrs: list[Instr]

    @property
    def opcodes(self) -> list[str]:
        return [i.op for i in self.instrs]


@dataclass
class SassFunction:
    name: str
    arch: str
    instrs: list[Instr] = field(default_factory=list)

    @property
    def opcodes(self) -> list[str]:
        return [i.op for i in self.instrs]

    def loops(self) -> list[Loop]:
        """Every loop: a branch back to an earlier address, with the instructions it spans."""
        out = []
        for i in self.instrs:
            if i.target is not None and i.target <= i.addr:
                out.append(Loop(i.target, i.addr, [j for j in self.instrs if i.target <= j.addr <= i.addr]))
        return out

    def hot_loops(self) -> list[Loop]:
        """The outermost loops that contain HMMA instructions."""
        hot = [lp for lp in self.loops() if any(op.startswith("HMMA") for op in lp.opcodes)]
        return [lp for lp in hot if not any(o is not lp and o.start <= lp.start and lp.end <= o.end for o in hot)]

    def outer_loops(self) -> list[Loop]:
        """The loops not inside another loop."""
        loops = self.loops()
        return [lp for lp in loops if not any(o is not lp and o.start <= lp.start and lp.end <= o.end for o in loops)]

    def main_loop(self) -> Loop | None:
        """The outermost loop with the most work: the most instructions it spans (inner loops
        counted once), ties to the first. Unlike ``hot_loops`` it needs no HMMA: a kernel built
        without tensor cores (Triton's FMA dot on sm_70) has its main loop in FFMA and loads."""
        return max(self.outer_loops(), key=lambda lp: len(lp.instrs), default=None)

    @property
    def hmma(self) -> int:
        return sum(1 for op in self.opcodes if op.startswith("HMMA"))

    @property
    def traps(self) -> int:
        return sum(1 for op in self.opcodes if op.startswith("BPT"))

    @property
    def local_memory_ops(self) -> int:
        return sum(1 for op in self.opcodes if op.split(".")[0] in ("LDL", "STL"))


_FUNCTION = re.compile(r"^\s*Function : (\S+)")
_INSTR = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(?:\{\s*)?(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*)")
_TARGET = re.compile(r"\b0x([0-9a-f]+)\b")


def parse_sass(text: str) -> list[SassFunction]:
    """Functions and their instructions (opcode with modifiers, no predicate; branch targets)
    from ``cuobjdump -sass``."""
    functions = []
    arch = ""
    current = None
    for line in text.splitlines():
        if m := _ARCH.match(line.strip()):
            arch = m.group(1)
        elif m := _FUNCTION.match(line):
            current = SassFunction(m.group(1), arch)
            functions.append(current)
        elif current is not None and (m := _INSTR.match(line)):
            op = m.group(3)
            target = None
            if op.split(".")[0] == "BRA" and (t := _TARGET.search(m.group(4))):
                target = int(t.group(1), 16)
            current.instrs.append(Instr(int(m.group(1), 16), op, target, m.group(4).strip(), m.group(2) is not None))
    return functions


def kernel_matches(demangled: str, pattern: str) -> bool:
    """Whether a kernel's demangled name matches a glob (fnmatch, case-sensitive, whole name):
    how budgets.toml, the build description's tensor_core_kernels, `report --launch` and
    build_info()'s launch configurations name kernels."""
    return fnmatch.fnmatchcase(demangled, pattern)


def first_match(demangled: str, by_pattern: dict, default=None):
    """The value of the first glob in ``by_pattern`` that ``demangled`` matches, else ``default``."""
    return next((v for p, v in by_pattern.items() if kernel_matches(demangled, p)), default)


def name_part_glob(part: str) -> str:
    """A glob matching every name that contains ``part`` literally."""
    return "*" + re.sub(r"([*?\[])", r"[\1]", part) + "*"
