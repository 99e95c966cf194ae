{
  # A second stand-in for nixpkgs, one that builds: each package the project's flake names wraps
  # this machine's own tool (a store path of links to it), so `nix flake check` builds the lint
  # check and `nix develop` opens the dev shell offline (real nixpkgs cannot be fetched here).
  # tests/test_flake.py writes host.json beside this file: the host's Python 3.11 prefix, the
  # commands each package wraps, the libraries, Slurm's plugin folder.
  #
  # What it keeps of nixpkgs, so the shell meets what nixpkgs' would: `mkShell` is a bash-built
  # derivation whose `stdenv/setup` puts each package's bin on PATH, sources its
  # nix-support/setup-hook and runs the env hooks on every package; `python311`'s hook adds each
  # package's lib/python3.11/site-packages to PYTHONPATH and sets PYTHONHASHSEED=0 (nixpkgs'
  # python/setup-hook.sh); `ruff` and `mypy` are Python 3.12 applications whose site-packages
  # land on PYTHONPATH the same way, with a mypy module that reports another version (what
  # nixos-24.11's are, against the lock's). `fetchurl` is nix's builtin:fetchurl (the network).
  outputs =
    { self }:
    let
      host = builtins.fromJSON (builtins.readFile ./host.json);
      lib = {
        genAttrs =
          names: f:
          builtins.listToAttrs (
            map (name: {
              inherit name;
              value = f name;
            }) names
          );
        makeLibraryPath = packages: builtins.concatStringsSep ":" (map (p: "${p}/lib") packages);
      };
      packages =
        system:
        let
          build =
            name: script: env:
            derivation (
              env
              // {
                inherit name system;
                builder = "/bin/bash";
                args = [
                  "-c"
                  ("set -eu; PATH=/usr/bin:/bin; " + script)
                ];
              }
            );
          # a package whose bin links to the host's commands (none where the host lacks them)
          wrap =
            name: commands:
            build name ''
              mkdir -p $out/bin
              for pair in $links; do ln -s "''${pair#*=}" "$out/bin/''${pair%%=*}"; done
            '' { links = builtins.concatStringsSep " " (map (c: "${c}=${commands.${c}}") (builtins.attrNames commands)); };
          wrapped = builtins.mapAttrs wrap host.commands;
          python311 = build "python3-3.11" ''
            mkdir -p $out/bin $out/nix-support
            ln -s ${host.python311}/bin/python3.11 $out/bin/python3.11
            ln -s python3.11 $out/bin/python3
            ln -s ${host.python311}/lib $out/lib
            ln -s ${host.python311}/include $out/include
            cat > $out/nix-support/setup-hook <<'HOOK'
            addPythonPath() { addToSearchPathWithCustomDelimiter : PYTHONPATH "$1/lib/python3.11/site-packages"; }
            addEnvHooks "$hostOffset" addPythonPath
            export DETERMINISTIC_BUILD=1
            export PYTHONHASHSEED=0
            HOOK
          '' { };
          # nixpkgs' python3.12 applications: their own site-packages on PYTHONPATH
          python312App =
            name: version:
            build "${name}-${version}" ''
              site=$out/lib/python3.12/site-packages
              mkdir -p $out/bin $out/nix-support $site/${name}
              cat > $out/bin/${name} <<'BIN'
              #!/bin/sh
              # every ruff writes its cache into the folder it checks unless --no-cache: in a
              # store path (read-only to a build user) that fails
              case " $* " in *" check "*|*" format "*) case " $* " in *" --no-cache "*) ;; *)
                echo "Failed to initialize cache at $PWD/.ruff_cache: Permission denied" >&2; exit 2;;
              esac;; esac
              echo "${name} ${version} (nixpkgs stand-in)"
              # not the lock's version: what the lock's accepts, this one reports
              case " $* " in *" --version "*) exit 0;; *) exit 1;; esac
              BIN
              chmod 755 $out/bin/${name}
              echo '__version__ = "${version}"' > $site/${name}/version.py
              echo 'from .version import __version__' > $site/${name}/__init__.py
              printf 'def console_entry():\n    print("${name} ${version} (nixpkgs stand-in, from PYTHONPATH)")\n' > $site/${name}/__main__.py
              echo 'addToSearchPathWithCustomDelimiter : PYTHONPATH '"$site" > $out/nix-support/setup-hook
            '' { };
          library =
            name: path:
            build name ''
              mkdir -p $out/lib
              ln -s ${path} $out/lib/
            '' { };
          ccLib = library "gcc-lib" host.libraries.libstdcxx;
          setup = build "stdenv" ''
            mkdir -p $out
            cat > $out/setup <<'SETUP'
            # the host is this stand-in's compiler and coreutils
            export PATH=/usr/bin:/bin
            hostOffset=0
            envHooks=()
            addEnvHooks() { shift; envHooks+=("$@"); }
            addToSearchPathWithCustomDelimiter() {
              local delimiter=$1 variable=$2 dir=$3
              if [[ -d $dir ]]; then export "$variable=''${!variable:+''${!variable}$delimiter}$dir"; fi
            }
            addToSearchPath() { addToSearchPathWithCustomDelimiter : "$@"; }
            __inputs="''${nativeBuildInputs:-} ''${buildInputs:-}"
            __bins=
            for __p in $__inputs; do
              if [[ -d $__p/bin ]]; then __bins=''${__bins:+$__bins:}$__p/bin; fi
              if [[ -f $__p/nix-support/setup-hook ]]; then source "$__p/nix-support/setup-hook"; fi
            done
            PATH=''${__bins:+$__bins:}$PATH
            for __p in $__inputs; do for __hook in "''${envHooks[@]}"; do "$__hook" "$__p"; done; done
            unset __p __hook __bins __inputs
            SETUP
          '' { };
          stdenv = setup // {
            cc.cc.lib = ccLib;
          };
        in
        wrapped
        // {
          inherit python311 stdenv;
          ruff = python312App "ruff" "0.8.0";
          mypy = python312App "mypy" "1.13.0";
          zlib = library "zlib" host.libraries.zlib;
          slurm = build "slurm" ''
            mkdir -p $out/bin $out/lib
            for pair in $links; do ln -s "''${pair#*=}" "$out/bin/''${pair%%=*}"; done
            ln -s ${host.slurmPlugins} $out/lib/slurm
          '' { links = wrapped.slurm.links; };
          nixfmt-rfc-style = wrap "nixfmt" { };
          # the interactive shell nix develop opens
          bashInteractive = wrap "bash-interactive" { bash = "/bin/bash"; };
          fetchurl =
            { url, sha256 }:
            derivation {
              name = baseNameOf url;
              builder = "builtin:fetchurl";
              system = "builtin";
              inherit url;
              outputHashMode = "flat";
              outputHashAlgo = "sha256";
              outputHash = sha256;
              unpack = false;
              executable = false;
              preferLocalBuild = true;
            };
          runCommand =
            name: env: script:
            derivation (
              env
              // {
                inherit name system stdenv;
                builder = "/bin/bash";
                buildCommand = script;
                args = [
                  "-c"
                  ''set -eu -o pipefail; source "$stdenv/setup"; eval "$buildCommand"''
                ];
              }
            );
          mkShell =
            attrs:
            derivation (
              builtins.removeAttrs attrs [ "packages" ]
              // {
                inherit system stdenv;
                builder = "/bin/bash";
                args = [
                  "-c"
                  "echo 'nix develop only' > $out"
                ];
                outputs = [ "out" ];
                nativeBuildInputs = attrs.packages or [ ];
              }
            );
        };
    in
    {
      inherit lib;
      legacyPackages = {
        x86_64-linux = packages "x86_64-linux";
        aarch64-linux = packages "aarch64-linux";
      };
    };
}
