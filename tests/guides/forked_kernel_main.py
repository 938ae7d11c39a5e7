"""What a forked worker runs to become an IPython kernel: `python -m ipykernel_launcher`.

Run by `forked_kernels` in a worker of the fork server (`forked_workers`), which has
imported TensorFlow, Keras and strategykit but started nothing of TensorFlow's runtime.
Arguments: the kernel's working directory, then ipykernel_launcher's own (`-f FILE`).
"""

import os
import sys

if __name__ == "__main__":
    cwd, *kernel_args = sys.argv[1:]
    os.chdir(cwd)
    # As ipykernel_launcher: the kernel's sys.path is the interpreter's, and IPython puts
    # "" (the working directory) first; not this folder, which the worker put there.
    del sys.path[0]
    sys.argv = [sys.argv[0], *kernel_args]
    # The kernel ends when its parent, the fork server, does (as a kernel started by
    # jupyter_client ends with its parent): the server ends when its test process does.
    os.environ["JPY_PARENT_PID"] = str(os.getppid())
    # matplotlib reads MPLBACKEND when imported, which happened in the server: do here
    # what importing it in the kernel would (with the backend IPKernelApp would set).
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    if "matplotlib" in sys.modules:
        sys.modules["matplotlib"].rcParams["backend"] = os.environ["MPLBACKEND"]

    from ipykernel import kernelapp

    from strategykit.launcher import tensorflow_log

    # As `kernelapp.launch_new_instance()`, with what `import strategykit` does in a fresh
    # kernel once ipykernel captures fd 2 (the server imported it before there was one):
    # TensorFlow's C++ log lines kept out of the cells' output.
    app = kernelapp.IPKernelApp.instance()
    app.initialize()
    tensorflow_log.filter_notebook_output()
    app.start()
