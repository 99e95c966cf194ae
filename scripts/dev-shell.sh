# shellcheck shell=bash
# Sourced by `nix develop` (flake.nix's shellHook), in the user's shell, from whatever folder of
# the checkout they are in: makes the dev shell's environment right and .venv ready.
#
# - the checkout: the folder holding flake.nix, Makefile and requirements.lock, found from the
#   current one upwards; .venv lives there (`make setup` runs there, the user stays where they are);
# - PYTHONPATH unset: nixpkgs' Python setup hooks put every Python package of the shell on it
#   (a Python 3.12 mypy's site-packages, say), ahead of .venv's own; PYTHONHASHSEED likewise
#   (a build's determinism setting);
# - .venv: rebuilt when its interpreter is gone (a pin bump or a garbage collection removed the
#   store path it points into), synced from the lock when the lock or pyproject.toml is newer;
#   a read-only checkout or a failed install is said, with what to do, and the shell still opens;
# - LD_LIBRARY_PATH (the flake sets libstdc++ and zlib for pip's manylinux wheels): the host's
#   GPU driver added where there is one. NixOS keeps it in /run/opengl-driver/lib; elsewhere
#   libcuda sits beside the host's own glibc, which must not shadow the shell's, so only the
#   driver's libraries are linked into a folder of their own.
#
# DEEPDIVE_SHELL_PYTHON (the flake sets it): the interpreter that builds .venv.
# DEEPDIVE_DRIVER_DIRS: where to look for libcuda.so.1 (default: the usual places).

__deepdive_dev_shell() {
  local say="deepdive-slurm dev shell:"
  local python=${DEEPDIVE_SHELL_PYTHON:-python3}
  unset PYTHONPATH PYTHONHASHSEED

  local root=$PWD
  until [[ -f $root/flake.nix && -f $root/Makefile && -f $root/requirements.lock ]]; do
    if [[ $root == / ]]; then
      echo "$say $PWD is not inside a deepdive-slurm checkout: run nix develop from the checkout (its .venv lives there)" >&2
      return 1
    fi
    root=$(dirname "$root")
  done

  __deepdive_host_driver "$say"

  local venv=$root/.venv
  if [[ -e $venv/bin/python || -L $venv/bin/python ]] && ! "$venv/bin/python" -c '' >/dev/null 2>&1; then
    local gone; gone=$(readlink "$venv/bin/python" || echo "$venv/bin/python")
    echo "$say .venv's interpreter ($gone) is gone (a pin bump or a garbage collection): rebuilding .venv" >&2
    if ! rm -rf "$venv"; then
      echo "$say cannot remove $venv: remove it, then run make setup" >&2
      return 1
    fi
  fi
  if ! make -q -C "$root" setup >/dev/null 2>&1; then
    if [[ ! -w $root ]]; then
      echo "$say $root is read-only: cannot create or sync .venv there; the shell has no .venv tools (make setup needs a writable checkout)" >&2
      return 1
    fi
    if ! make --no-print-directory -C "$root" setup PYTHON="$python"; then
      echo "$say make setup failed (its error is above): .venv is not ready, its ruff, mypy and pytest are missing or stale; fix that and run make setup" >&2
      return 1
    fi
  fi
  export VIRTUAL_ENV=$venv
  export PATH="$venv/bin:$PATH"
  echo "$say .venv ready in $root: make test-fast, make test, make run" >&2
}

__deepdive_host_driver() {  # __deepdive_host_driver SAY: the host's libcuda on LD_LIBRARY_PATH
  local dirs=${DEEPDIVE_DRIVER_DIRS:-/run/opengl-driver/lib /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu /usr/lib64 /usr/lib/wsl/lib /usr/local/nvidia/lib64}
  local dir found=
  for dir in $dirs; do
    if [[ -e $dir/libcuda.so.1 ]]; then
      found=$dir
      break
    fi
  done
  [[ -n $found ]] || return 0
  local use=$found
  if [[ -e $found/libc.so.6 ]]; then  # the host's system folder: its driver libraries only
    use=${TMPDIR:-/tmp}/deepdive-host-driver-$(id -u)
    mkdir -p "$use" || return 0
    rm -f "$use"/*.so*
    local library
    for library in "$found"/libcuda.so* "$found"/libnvidia-*.so* "$found"/libcudadebugger.so*; do
      [[ -e $library ]] && ln -sf "$library" "$use/"
    done
  fi
  export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$use
  echo "$1 the host's GPU driver from $found on LD_LIBRARY_PATH ($use)" >&2
}

__deepdive_dev_shell
unset -f __deepdive_dev_shell __deepdive_host_driver
