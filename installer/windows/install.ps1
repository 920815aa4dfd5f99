# Install Halaman for the current user (no administrator rights): copies the launcher to
# %LOCALAPPDATA%\Programs\Halaman, adds a Start-menu shortcut and a Settings > Apps entry.
# The first start of Halaman then sets up PyTorch (CUDA build with an NVIDIA GPU) and the default model.
# NOT TESTED on Windows here; see installer/README.md.
#   powershell -ExecutionPolicy Bypass -File install.ps1 [-Prefix DIR] [-Torch auto|cpu|cuda] [-PrepareNow]
param(
    [string]$Prefix = "",
    [ValidateSet("auto", "cpu", "cuda")][string]$Torch = "auto",
    [switch]$PrepareNow
)
$ErrorActionPreference = "Stop"
$here = Split-Path -Parent $MyInvocation.MyCommand.Path

function Find-Python {
    # The python.org launcher (py.exe) knows every installed Python. 3.11 is what Halaman is tested with.
    if (Get-Command py -ErrorAction SilentlyContinue) {
        foreach ($version in "3.11", "3.12", "3.13", "3.14") {
            $exe = & py "-$version" -c "import sys; print(sys.executable)" 2>$null
            if ($LASTEXITCODE -eq 0 -and $exe) { return $exe.Trim() }
        }
    }
    # A python.exe on PATH, but not the Microsoft Store stub in WindowsApps (it opens the Store).
    $python = Get-Command python -ErrorAction SilentlyContinue
    if ($python -and $python.Source -notlike "*\WindowsApps\*") {
        & $python.Source -c "import sys; sys.exit(sys.version_info < (3, 11))" 2>$null
        if ($LASTEXITCODE -eq 0) { return $python.Source }
    }
    return $null
}

$py = Find-Python
if (-not $py) {
    Write-Host "Halaman needs Python 3.11 or newer, and none was found."
    Write-Host "Install it from https://www.python.org/downloads/windows/ (keep 'tcl/tk' and the 'py launcher'"
    Write-Host "ticked), or run:  winget install Python.Python.3.11   - then double-click 'Install Halaman' again."
    Read-Host "Press Enter to close"
    exit 1
}
$arguments = @("-s", (Join-Path $here "launch.py"), "install", "--torch", $Torch)
if ($Prefix) { $arguments += @("--prefix", $Prefix) }
if ($PrepareNow) { $arguments += "--prepare-now" }
& $py @arguments
$code = $LASTEXITCODE
if ($code -eq 0) {
    Write-Host ""
    Write-Host "Halaman is in the Start menu. Its first start downloads PyTorch and the default model"
    Write-Host "(a few minutes, with a progress window); later starts are quick."
}
Read-Host "Press Enter to close"
exit $code
