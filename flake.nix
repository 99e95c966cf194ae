{
  # `nix develop`: the pinned developer shell. The same Python (3.11), uv, ruff, mypy, the
  # Slurm client and daemons with munge (for the tests' private cluster), Apptainer and podman
  # (the images, container CI), git, make and wrk (`make bench`); on entry the shell creates
  # or syncs .venv from requirements.lock (`make setup`: torch, then the lock with hashes).
  # `nix flake check` runs the linters; `nix fmt` formats this file.
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
      forAll = f: nixpkgs.lib.genAttrs systems (system: f nixpkgs.legacyPackages.${system});
      # every tool the Makefile, .ci/run and the tests call
      tools = pkgs: [
        pkgs.python311
        pkgs.uv
        pkgs.ruff
        pkgs.mypy
        pkgs.gnumake
        pkgs.git
        pkgs.slurm
        pkgs.munge
        pkgs.apptainer
        pkgs.podman
        pkgs.debootstrap
        pkgs.wrk
      ];
    in
    {
      devShells = forAll (pkgs: {
        default = pkgs.mkShell {
          name = "deepdive-slurm";
          packages = tools pkgs;
          shellHook = ''
            export PYTHONNOUSERSITE=1
            if [ ! -x .venv/bin/python ] || [ requirements.lock -nt .venv/.installed-stamp ]; then
              make setup PYTHON=${pkgs.python311}/bin/python3.11
            fi
            export PATH="$PWD/.venv/bin:$PATH"
            echo "deepdive-slurm dev shell: make test, make run"
          '';
        };
      });

      checks = forAll (pkgs: {
        lint = pkgs.runCommand "deepdive-slurm-lint" { nativeBuildInputs = [ pkgs.ruff ]; } ''
          cd ${self}
          ruff check .
          ruff format --check .
          touch $out
        '';
      });

      formatter = forAll (pkgs: pkgs.nixfmt-rfc-style);
    };
}
