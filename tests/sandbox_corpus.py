"""Ordinary tool calls: the code a model writes in a tool-use episode, and the standard library
around it (issue 50).

The sandbox's seccomp filter is an allow list (``collector/sandbox.kafel``). What it allows was
measured by running these snippets, the sandbox's tests and the hostile tests under a logging
filter (``benchmarks/sandbox_syscalls.py``); ``tests/store/test_sandbox.py`` runs every snippet under
the real filter and requires each to exit 0 with no ``EPERM`` a program did not expect.

Each snippet prints what it did. Where something fails for a reason that is not the filter (no
``/dev/shm`` for a semaphore, no ``/etc/passwd``, no network), the snippet catches it and prints
the exception's class, so the call still exits 0 and a change in how it fails shows.
"""

from __future__ import annotations

#: name → code. Plain Python 3.8+, standard library only (the jail runs the system's python3).
SNIPPETS: dict[str, str] = {
    "arithmetic": "print(3 + 4 * 5, 2 ** 100, 7 / 3, 7 // 3, -7 % 3, divmod(17, 5), round(2.675, 2))\n",
    "math": (
        "import math, cmath, fractions, decimal, statistics\n"
        "print(math.factorial(20), math.comb(10, 3), math.gcd(12, 18), math.isqrt(10**20), math.sqrt(2))\n"
        "print(cmath.sqrt(-1), fractions.Fraction(3, 4) + fractions.Fraction(1, 6))\n"
        "decimal.getcontext().prec = 50\nprint(decimal.Decimal(1) / decimal.Decimal(7))\n"
        "print(statistics.mean([1, 2, 3, 4]), statistics.median([3, 1, 2]), statistics.stdev([1, 2, 3, 4]))\n"
    ),
    "collections and itertools": (
        "import collections, itertools, functools, operator, heapq, bisect, array, copy\n"
        "c = collections.Counter('mississippi'); print(c.most_common(2))\n"
        "print(list(itertools.permutations('abc', 2))[:3], list(itertools.accumulate(range(5))))\n"
        "print(functools.reduce(operator.mul, range(1, 10)), heapq.nsmallest(2, [5, 1, 4]))\n"
        "a = [1, 3, 5]; bisect.insort(a, 4); print(a, array.array('i', a).tobytes()[:4], copy.deepcopy({'a': [1]}))\n"
        "@functools.lru_cache(None)\ndef fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\nprint(fib(90))\n"
    ),
    "text": (
        "import re, string, textwrap, unicodedata, json, csv, io, difflib, html, base64, codecs\n"
        "print(re.findall(r'\\d+', 'a1b22c333'), string.ascii_lowercase[:5], textwrap.shorten('hello world ' * 5, 20))\n"
        "print(unicodedata.name('é'), json.dumps({'x': [1, 2.5, None]}), html.escape('<a>'), base64.b64encode(b'hi'))\n"
        "w = io.StringIO(); csv.writer(w).writerow([1, 'a,b']); print(w.getvalue().strip())\n"
        "print(list(difflib.unified_diff(['a'], ['b'], lineterm=''))[:3], codecs.encode('abc', 'rot13'))\n"
        "print('ß'.upper(), 'İ'.lower(), '日本'.encode('utf-8'), f'{1234567.891:,.2f}')\n"
    ),
    "dates and times": (
        "import datetime, time, calendar\n"
        "print(datetime.date(2024, 2, 29) + datetime.timedelta(days=365), calendar.isleap(2024))\n"
        "print(datetime.datetime.now().year > 2000, datetime.datetime.now(datetime.timezone.utc).tzinfo)\n"
        "print(time.time() > 0, time.monotonic() > 0, time.perf_counter() > 0, time.process_time() >= 0)\n"
        "print(time.strftime('%Y', time.localtime()) > '2000', time.gmtime(0).tm_year)\n"
        "time.sleep(0.01)\nprint(calendar.monthrange(2024, 2))\n"
        "try:\n    import zoneinfo; print(zoneinfo.ZoneInfo('Europe/Paris').key)\n"
        "except Exception as e:\n    print('zoneinfo', type(e).__name__)\n"
    ),
    "randomness and hashes": (
        "import random, secrets, hashlib, hmac, uuid, os, zlib\n"
        "random.seed(0); print(random.randint(1, 100), random.random() < 1, secrets.token_hex(4).isalnum())\n"
        "print(hashlib.sha256(b'x').hexdigest()[:8], hashlib.md5(b'x').hexdigest()[:8], zlib.crc32(b'x'))\n"
        "print(hmac.new(b'k', b'm', 'sha256').hexdigest()[:8], len(os.urandom(16)), uuid.uuid4().version)\n"
        "print(len(os.getrandom(8)), random.SystemRandom().random() < 1)\n"
    ),
    "files in /tmp": (
        "import os, pathlib, tempfile, shutil, glob, fnmatch, stat\n"
        "p = pathlib.Path('/tmp/work'); p.mkdir(); (p / 'a.txt').write_text('hello\\n' * 100)\n"
        "print((p / 'a.txt').read_text()[:6].strip(), os.listdir(p), os.stat(p / 'a.txt').st_size)\n"
        "shutil.copy(p / 'a.txt', p / 'b.txt'); shutil.copytree(p, '/tmp/work2'); os.rename(p / 'b.txt', p / 'c.txt')\n"
        "os.symlink(p / 'a.txt', p / 'l'); os.link(p / 'a.txt', p / 'h'); print(os.readlink(p / 'l'), os.path.islink(p / 'l'))\n"
        "os.chmod(p / 'a.txt', 0o600); os.utime(p / 'a.txt', (0, 0)); print(oct(stat.S_IMODE(os.stat(p / 'a.txt').st_mode)))\n"
        "with open(p / 'a.txt', 'r+b') as f:\n"
        "    f.seek(0, 2); f.write(b'x'); f.flush(); os.fsync(f.fileno()); os.ftruncate(f.fileno(), 10)\n"
        "with tempfile.NamedTemporaryFile('w', delete=False) as f:\n    f.write('t')\n"
        "with tempfile.TemporaryDirectory() as d:\n    open(os.path.join(d, 'x'), 'w').close(); print(len(os.listdir(d)))\n"
        "print(sorted(glob.glob('/tmp/work/*')), fnmatch.fnmatch('a.txt', '*.txt'), os.getcwd())\n"
        "print([e.name for e in os.scandir('/tmp')][:5] != [], shutil.disk_usage('/tmp').total > 0, os.statvfs('/tmp').f_bsize)\n"
        "os.mkfifo('/tmp/fifo'); print(stat.S_ISFIFO(os.stat('/tmp/fifo').st_mode)); shutil.rmtree('/tmp/work2')\n"
        "os.makedirs('/tmp/a/b/c', exist_ok=True); print(sum(len(f) for _, _, f in os.walk('/tmp')) > 0)\n"
    ),
    "archives and compression": (
        "import gzip, bz2, lzma, zipfile, tarfile, io, shelve, pickle, sqlite3\n"
        "data = b'reflexdb ' * 1000\n"
        "print(len(gzip.compress(data)), len(bz2.compress(data)), len(lzma.compress(data)))\n"
        "with zipfile.ZipFile('/tmp/z.zip', 'w', zipfile.ZIP_DEFLATED) as z:\n    z.writestr('a', data)\n"
        "print(zipfile.ZipFile('/tmp/z.zip').read('a') == data)\n"
        "with tarfile.open('/tmp/t.tgz', 'w:gz') as t:\n    t.add('/tmp/z.zip')\nprint(tarfile.open('/tmp/t.tgz').getnames())\n"
        "print(pickle.loads(pickle.dumps({'a': (1, 2)})))\n"
        "with shelve.open('/tmp/s') as s:\n    s['k'] = [1]\n"
        "db = sqlite3.connect(':memory:'); db.execute('create table t(x)'); db.execute('insert into t values (42)')\n"
        "print(db.execute('select x from t').fetchone()); f = sqlite3.connect('/tmp/f.db'); f.execute('create table t(x)'); f.commit()\n"
    ),
    "processes": (
        "import os, sys, subprocess, signal, time\n"
        "print(subprocess.run([sys.executable, '-c', 'print(6 * 7)'], capture_output=True, text=True).stdout.strip())\n"
        "print(subprocess.run('echo hi | tr a-z A-Z', shell=True, capture_output=True, text=True).stdout.strip())\n"
        "print(subprocess.check_output(['/bin/ls', '/tmp']) is not None, os.system('true'))\n"
        "pid = os.fork()\nif pid == 0:\n    os._exit(3)\nprint('fork', os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(10)']); p.send_signal(signal.SIGTERM)\n"
        "print('killed', p.wait())\n"
        "r, w = os.pipe(); pid = os.fork()\n"
        "if pid == 0:\n    os.write(w, b'child'); os._exit(0)\n"
        "os.close(w); print(os.read(r, 10)); os.waitpid(pid, 0)\n"
        "print(os.getpid() > 0, os.getppid() >= 0, os.getuid(), os.getgid(), os.getgroups(), os.umask(0o22))\n"
        "try:\n    pid = os.posix_spawn(sys.executable, [sys.executable, '-c', 'pass'], {}); print('spawn', os.waitpid(pid, 0)[1])\n"
        "except OSError as e:\n    print('posix_spawn', type(e).__name__)\n"
        "os.kill(os.getpid(), 0); print(os.sched_getaffinity(0) != set(), os.cpu_count() > 0, os.getpriority(os.PRIO_PROCESS, 0))\n"
    ),
    "threads and async": (
        "import threading, queue, concurrent.futures, asyncio, time, selectors, select, socket\n"
        "q = queue.Queue(); t = threading.Thread(target=lambda: q.put(sum(range(10**5)))); t.start(); t.join(); print(q.get())\n"
        "with concurrent.futures.ThreadPoolExecutor(4) as ex:\n    print(list(ex.map(lambda x: x * x, range(8))))\n"
        "async def main():\n    await asyncio.sleep(0.01)\n    r = await asyncio.gather(*(asyncio.sleep(0, result=i) for i in range(3)))\n"
        "    p = await asyncio.create_subprocess_exec('/bin/echo', 'x', stdout=asyncio.subprocess.PIPE)\n"
        "    return r, (await p.communicate())[0]\n"
        "print(asyncio.run(main()))\n"
        "ev = threading.Event(); threading.Timer(0.01, ev.set).start(); print(ev.wait(2))\n"
        "a, b = socket.socketpair(); a.sendall(b'ping'); print(b.recv(4)); a.close(); b.close()\n"
        "s = selectors.DefaultSelector(); r, w = __import__('os').pipe(); s.register(r, selectors.EVENT_READ)\n"
        "print(s.select(0), select.select([r], [], [], 0), select.poll().poll(0)); s.close()\n"
        "lock = threading.Lock(); c = threading.Condition(lock); b = threading.Barrier(1); print(b.wait(), lock.acquire(timeout=1))\n"
    ),
    "multiprocessing": (
        "import multiprocessing as mp\n"
        "def sq(x):\n    return x * x\n"
        "if __name__ == '__main__':\n"
        "    ctx = mp.get_context('fork')\n"
        "    a, b = ctx.Pipe(); p = ctx.Process(target=lambda c: c.send(sq(7)), args=(b,)); p.start(); print(a.recv()); p.join()\n"
        "    try:\n        with ctx.Pool(2) as pool:\n            print(pool.map(sq, range(4)))\n"
        "    except OSError as e:\n        print('pool', type(e).__name__)\n"
    ),
    "signals and limits": (
        "import signal, resource, os, time, faulthandler, sys, gc, tracemalloc, warnings\n"
        "signal.signal(signal.SIGALRM, lambda *a: print('alarm')); signal.setitimer(signal.ITIMER_REAL, 0.01); time.sleep(0.05)\n"
        "signal.signal(signal.SIGUSR1, lambda *a: print('usr1')); os.kill(os.getpid(), signal.SIGUSR1)\n"
        "signal.pthread_kill(__import__('threading').get_ident(), 0)\n"
        "print(resource.getrlimit(resource.RLIMIT_NOFILE), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss > 0)\n"
        "resource.setrlimit(resource.RLIMIT_CORE, (0, 0)); faulthandler.enable(); faulthandler.dump_traceback(sys.stderr)\n"
        "tracemalloc.start(); x = [0] * 10**5; print(tracemalloc.get_traced_memory()[0] > 0); tracemalloc.stop()\n"
        "gc.collect(); warnings.warn('w'); print(sys.getrecursionlimit(), sys.getsizeof([]))\n"
        "print(os.nice(1), os.sched_getscheduler(0), os.getloadavg()[0] >= 0, os.sched_yield())\n"
    ),
    "system information": (
        "import os, sys, platform, locale, socket, getpass, sysconfig, shutil\n"
        "print(platform.python_version(), platform.system(), platform.machine(), sys.platform, os.uname().sysname)\n"
        "print(socket.gethostname(), locale.getpreferredencoding(False), sys.getfilesystemencoding())\n"
        "print(sorted(os.environ), os.sysconf('SC_PAGE_SIZE'), shutil.get_terminal_size((80, 24)))\n"
        "print(sys.stdout.isatty(), sys.stdin.isatty(), os.isatty(2), os.path.expanduser('~'), shutil.which('ls'))\n"
        "print(open('/proc/self/status').read().count('\\n') > 5, open('/proc/cpuinfo').read()[:0])\n"
        "try:\n    print(getpass.getuser())\nexcept Exception as e:\n    print('getuser', type(e).__name__)\n"
        "print(sysconfig.get_paths()['stdlib'])\n"
    ),
    "low level": (
        "import ctypes, ctypes.util, mmap, os, fcntl, struct, errno, io\n"
        "libc = ctypes.CDLL(None); print(libc.getpid() == os.getpid(), ctypes.util.find_library('c') is not None)\n"
        "cb = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)(lambda x: x + 1); print(cb(41))\n"
        "m = mmap.mmap(-1, 1 << 20); m[:5] = b'hello'; print(m[:5]); m.close()\n"
        "fd = os.memfd_create('m'); os.write(fd, b'abc'); print(os.pread(fd, 3, 0)); os.close(fd)\n"
        "with open('/tmp/lock', 'w') as f:\n    fcntl.flock(f, fcntl.LOCK_EX); fcntl.lockf(f, fcntl.LOCK_UN); print(fcntl.fcntl(f, fcntl.F_GETFL) >= 0)\n"
        "r, w = os.pipe2(os.O_CLOEXEC); os.set_blocking(r, False); print(os.get_blocking(r), os.get_inheritable(w))\n"
        "os.set_inheritable(w, True); d = os.dup(w); os.dup2(d, 10); os.close(d); os.close(10)\n"
        "fd = os.open('/tmp/big', os.O_CREAT | os.O_RDWR); os.posix_fallocate(fd, 0, 4096); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)\n"
        "os.pwrite(fd, b'x', 10); print(os.fstat(fd).st_size, os.lseek(fd, 0, os.SEEK_END)); os.close(fd)\n"
        "src = os.open('/tmp/big', os.O_RDONLY); dst = os.open('/tmp/big2', os.O_CREAT | os.O_WRONLY)\n"
        "print(os.sendfile(dst, src, 0, 10), os.copy_file_range(src, dst, 5, 0, 0)); os.close(src); os.close(dst)\n"
        "try:\n    fd = os.eventfd(0); os.eventfd_write(fd, 3); print(os.eventfd_read(fd)); os.close(fd)\n"
        "except AttributeError:\n    print(3)\n"
        "try:\n    fd = os.pidfd_open(os.getpid()); os.close(fd); print('pidfd')\n"
        "except OSError as e:\n    print('pidfd', errno.errorcode[e.errno])\n"
        "print(struct.pack('<I', 7), io.BytesIO(b'ab').read(1))\n"
    ),
    "errors a program makes": (
        "import sys, traceback\n"
        "try:\n    1 / 0\nexcept ZeroDivisionError:\n    traceback.print_exc()\n"
        "try:\n    open('/etc/passwd')\nexcept OSError as e:\n    print('no /etc', type(e).__name__)\n"
        "try:\n    import pwd; pwd.getpwuid(0)\nexcept KeyError as e:\n    print('no passwd', type(e).__name__)\n"
        "try:\n    import numpy\nexcept ImportError as e:\n    print('no numpy', type(e).__name__)\n"
        "try:\n    open('/usr/x', 'w')\nexcept OSError as e:\n    print('read-only /usr', type(e).__name__)\n"
        "def deep(n):\n    return deep(n + 1)\n"
        "try:\n    deep(0)\nexcept RecursionError:\n    print('recursion')\n"
    ),
    "the network is not there": (
        "import socket, urllib.request, errno\n"
        "for fam, kind in ((socket.AF_INET, socket.SOCK_STREAM), (socket.AF_INET6, socket.SOCK_DGRAM)):\n"
        "    try:\n        s = socket.socket(fam, kind); s.settimeout(1); s.connect(('127.0.0.1', 5432) if fam == socket.AF_INET else ('::1', 53))\n"
        "    except OSError as e:\n        print(fam.name, 'refused', errno.errorcode.get(e.errno, e.errno))\n"
        "try:\n    urllib.request.urlopen('http://example.com', timeout=1)\nexcept Exception as e:\n    print('urlopen', type(e).__name__)\n"
        "try:\n    print(socket.getaddrinfo('localhost', 80)[0][4])\nexcept OSError as e:\n    print('getaddrinfo', type(e).__name__)\n"
        "u = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); u.bind('/tmp/sock'); u.listen(1)\n"
        "c = socket.socket(socket.AF_UNIX); c.connect('/tmp/sock'); a, _ = u.accept(); c.send(b'u'); print(a.recv(1))\n"
    ),
    "code and imports": (
        "import ast, dis, importlib, inspect, io, contextlib, sys, timeit, textwrap, pydoc, typing, dataclasses, enum, abc\n"
        "print(ast.dump(ast.parse('x = 1'))[:20], eval(compile('2 + 2', '<s>', 'eval')))\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n    dis.dis(lambda: 1)\n"
        "print(importlib.import_module('json').dumps([1]), inspect.signature(print) is not None, timeit.timeit('1+1', number=100) >= 0)\n"
        "@dataclasses.dataclass\nclass P:\n    x: int\nprint(P(1), enum.Enum('E', 'A B').A, typing.get_type_hints(P))\n"
        "exec('def f():\\n    return 5\\nprint(f())')\n"
        "print(sys.version_info >= (3, 8))\n"
    ),
}
