{
  # `nix develop`: the pinned developer shell. The same Python (3.11), uv, make, git, the Slurm
  # client and daemons with munge (for the tests' private cluster), Apptainer and podman (the
  # images, container CI), debootstrap and wrk (`make bench`). Entering it (scripts/dev-shell.sh,
  # from any folder of the checkout) creates or syncs .venv from requirements.lock (`make
  # setup`), whose ruff and mypy are the linters: nixpkgs' are other versions, so the shell
  # has none of its own. `nix flake check` runs the lock's ruff (its static wheel, by the
  # lock's hash); `nix fmt flake.nix` formats this file. docs/environment.md.
  description = "deepdive-slurm: DeepDive-style multi-turn GRPO (slime + SGLang + Megatron) on Slurm";

  # nixos-24.11 at a fixed revision (2025-06-30); flake.lock records its narHash.
  inputs.nixpkgs.url = "github:NixOS/nixpkgs/50ab793786d9de88ee30ec4e4c24fb4236fc2674";

  outputs =
    { self, nixpkgs }:
    let
      systems = [
        "x86_64-linux"
        "aarch64-linux"
      ];
      forAll = f: nixpkgs.lib.genAttrs systems (system: f system nixpkgs.legacyPackages.${system});
      # every tool the Makefile, .ci/run and the tests call, but the linters (.venv's, below)
      tools = pkgs: [
        pkgs.python311
        pkgs.uv
        pkgs.gnumake
        pkgs.git
        pkgs.slurm
        pkgs.munge
        pkgs.apptainer
        pkgs.podman
        pkgs.debootstrap
        pkgs.wrk
      ];
      # The linter is the lock's: requirements.lock pins ruff==0.17.6 with these hashes among
      # its own (tests/test_flake.py checks it). Its musllinux wheels hold one static binary.
      ruffVersion = "0.17.6";
      ruffWheels = {
        x86_64-linux = {
          url = "https://files.pythonhosted.org/packages/81/c7/e09d220818ab146b736d62e0676dad215215d7de0884bbdad9fa075dc7d2/ruff-0.17.6-py3-none-musllinux_1_2_x86_64.whl";
          sha256 = "3db61f5015600543a581b07fa7f6f64afa0eeedefe16034cadd88c4074087582";
        };
        aarch64-linux = {
          url = "https://files.pythonhosted.org/packages/98/0a/b477f075a4a94eb541bf1c759a3e72b2a3d6390af7a13a5be0887229f67c/ruff-0.17.6-py3-none-musllinux_1_2_aarch64.whl";
          sha256 = "fb589e032806bb942e4fb526f30b80a1a64112147ed9f1d38cc3de2e255b6f45";
        };
      };
      lockedRuff =
        system: pkgs:
        pkgs.runCommand "ruff-${ruffVersion}"
          {
            nativeBuildInputs = [ pkgs.unzip ];
            wheel = pkgs.fetchurl ruffWheels.${system};
          }
          ''
            unzip -q "$wheel" "ruff-${ruffVersion}.data/scripts/ruff" -d wheel
            mkdir -p "$out/bin"
            cp "wheel/ruff-${ruffVersion}.data/scripts/ruff" "$out/bin/ruff"
            chmod 755 "$out/bin/ruff"
          '';
    in
    {
      devShells = forAll (
        system: pkgs: {
          default = pkgs.mkShell {
            name = "deepdive-slurm";
            packages = tools pkgs;
            # pip's manylinux wheels (numpy, torch) under nixpkgs' Python find no libstdc++ or
            # zlib of their own; the host's GPU driver is added on entry where there is one
            LD_LIBRARY_PATH = nixpkgs.lib.makeLibraryPath [
              pkgs.stdenv.cc.cc.lib
              pkgs.zlib
            ];
            DEEPDIVE_SHELL_PYTHON = "${pkgs.python311}/bin/python3.11";
            shellHook = ''
              source ${./scripts/dev-shell.sh}
            '';
          };
        }
      );

      checks = forAll (
        system: pkgs: {
          # --no-cache: the source is read-only in the store
          lint = pkgs.runCommand "deepdive-slurm-lint" { nativeBuildInputs = [ (lockedRuff system pkgs) ]; } ''
            cd ${self}
            ruff --version
            ruff check --no-cache .
            ruff format --check --no-cache .
            touch $out
          '';
        }
      );

      formatter = forAll (system: pkgs: pkgs.nixfmt-rfc-style);
    };
}
