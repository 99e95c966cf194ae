{
  # `nix develop`: the pinned developer shell (Python 3.11, linters, Slurm client, Apptainer, wrk).
  # The project itself installs into .venv with `make setup`, as it does without nix.
  description = "deepdive-slurm: DeepDive-style multi-turn GRPO (slime + SGLang + Megatron) on Slurm";

  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-24.11";

  outputs = { self, nixpkgs }:
    let
      systems = [ "x86_64-linux" "aarch64-linux" ];
      forAll = f: nixpkgs.lib.genAttrs systems (system: f nixpkgs.legacyPackages.${system});
    in
    {
      devShells = forAll (pkgs: {
        default = pkgs.mkShell {
          packages = [
            pkgs.python311
            pkgs.uv
            pkgs.ruff
            pkgs.gnumake
            pkgs.git
            pkgs.slurm        # sbatch / squeue / sacct clients (and daemons for local tests)
            pkgs.munge
            pkgs.apptainer
            pkgs.wrk          # load generator for `make bench`
          ];
          shellHook = ''
            export PYTHONNOUSERSITE=1
            echo "deepdive-slurm dev shell: run 'make test' or 'make run'"
          '';
        };
      });
    };
}
