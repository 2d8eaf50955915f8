"""Peak memory of a child Python process, measured so that the parent cannot leak into it.

``resource.getrusage(RUSAGE_SELF).ru_maxrss`` is the wrong reading in a spawned child: on
Linux, ``execve`` folds the *old* address space's high-water mark into the new process's
``maxrss``, and CPython spawns with ``vfork``, so the old address space is the parent's. A
child of a 240 MiB pytest process reports 240 MiB however little it uses (seen in CI). The
``VmHWM`` line of ``/proc/self/status`` belongs to the new address space alone.

``PEAK_RSS`` is source to prepend to a child's script; it defines ``peak_rss_kib()``.
"""

PEAK_RSS = '''
def peak_rss_kib():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
'''
