#!/usr/bin/env python3
"""Checks the PDL contract (src/ops/cuda/launch.cuh) in a binary's SASS: no kernel issues a global load before its
griddepcontrol.wait (ACQBULK), except the kernels that prefetch weights before it (PREFETCHERS), and those only
through the non-coherent path their weight loads use (LDG...CONSTANT), never a coherent load (their activations).

ptxas treats non-coherent loads as reads of constant memory and may schedule them above the wait: in the
twenty-eighth session's build, gemv16_mma's x loads sat there and a product read an RMSNorm's output before the
norm had finished. Usage: pdl_sass_check.py LISTING (cuobjdump -sass output) or pdl_sass_check.py --binary FILE.
Exit status 0 when every kernel keeps the contract; prints the offenders otherwise."""
import re
import subprocess
import sys

# Kernels that load their first weight chunks before the wait (regexes over demangled names).
PREFETCHERS = (r"gemv16_mma_kernel", r"gemv16_kernel<", r"gemv_q8_kernel<", r"mmq_kernel<")


def demangle(name):
    try:
        return subprocess.run(["c++filt"], input=name, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return name


def loads_before_wait(lines):
    """{kernel: [non-coherent loads, coherent loads]} counted before each kernel's first ACQBULK (if it has one)."""
    out, fn, counting = {}, None, False
    for line in lines:
        m = re.search(r"Function : (\S+)", line)
        if m:
            fn, counting = m.group(1), True
            out[fn] = [0, 0, False]
        elif fn is not None and counting:
            if "ACQBULK" in line:
                counting, out[fn][2] = False, True
            elif re.search(r"\bLDG\.", line):
                out[fn][0 if "CONSTANT" in line else 1] += 1
    return {k: v[:2] for k, v in out.items() if v[2]}


def main(argv):
    if len(argv) == 3 and argv[1] == "--binary":
        tool = "/usr/local/cuda/bin/cuobjdump"
        lines = subprocess.run([tool, "-sass", argv[2]], capture_output=True, text=True, check=True).stdout.splitlines()
    elif len(argv) == 2:
        with open(argv[1]) as f:
            lines = f.read().splitlines()
    else:
        print(__doc__)
        return 2
    kernels = loads_before_wait(lines)
    bad = []
    for name, (nc, coherent) in kernels.items():
        plain = demangle(name)
        allowed = any(re.search(p, plain) for p in PREFETCHERS)
        if coherent or (nc and not allowed):
            bad.append("%s: %d non-coherent, %d coherent loads before the wait" % (plain[:160], nc, coherent))
    print("pdl sass check: %d kernels with a wait, %d break the contract" % (len(kernels), len(bad)))
    for b in bad:
        print("  " + b)
    return 1 if bad or not kernels else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
