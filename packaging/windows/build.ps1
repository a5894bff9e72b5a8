# Build dist\Branchwise-<version>-windows-x64-setup.exe (PyInstaller onedir + Inno Setup 6).
#
#   pwsh packaging\windows\build.ps1
#
# Environment:
#   BRANCHWISE_PORTABLE=1  rebuild llama-cpp-python with CMAKE_ARGS (default -DGGML_NATIVE=off)
#                          before freezing; the release workflow sets it. Default: reuse the .venv.
#   PYINSTALLER_VERSION    default 6.22.3
#   ISCC                   path to ISCC.exe (default: Inno Setup 6 in Program Files, else choco install)
$ErrorActionPreference = 'Stop'
$PSNativeCommandUseErrorActionPreference = $true   # PowerShell 7.3+: a failing exe stops the script

# A plain function (no param block), so arguments such as --frozen reach the program untouched.
function Invoke-Checked {
    $exe, $rest = $args
    & $exe @rest
    if ($LASTEXITCODE -ne 0) { throw "$exe $($rest -join ' ') failed with exit code $LASTEXITCODE" }
}

$Root = (Resolve-Path "$PSScriptRoot\..\..").Path
Set-Location $Root
$Start = Get-Date
function Say([string]$Text) { Write-Host ("`n[+{0:n0}s] {1}" -f ((Get-Date) - $Start).TotalSeconds, $Text) }
$PyInstallerVersion = if ($env:PYINSTALLER_VERSION) { $env:PYINSTALLER_VERSION } else { '6.22.3' }

Say 'uv sync'
Invoke-Checked uv sync --frozen

if ($env:BRANCHWISE_PORTABLE -eq '1') {
    Say 'rebuild llama-cpp-python (GGML_NATIVE=off)'
    $req = (uv export --frozen --no-hashes --no-emit-project --no-header | Select-String -Pattern '^llama-cpp-python==').Line.Split(';')[0].Trim()
    if (-not $env:CMAKE_ARGS) { $env:CMAKE_ARGS = '-DGGML_NATIVE=off' }
    Invoke-Checked uv pip install --reinstall-package llama-cpp-python --no-binary llama-cpp-python --no-cache --no-deps $req
}

$Version = (uv run --frozen --no-sync python -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])').Trim()
$Work = Join-Path $Root 'build\pyinstaller'
$Bundle = Join-Path $Work 'dist\branchwise'
New-Item -ItemType Directory -Force -Path (Join-Path $Root 'dist') | Out-Null

Say "PyInstaller $PyInstallerVersion (branchwise $Version)"
Invoke-Checked uv run --frozen --no-sync --with "pyinstaller==$PyInstallerVersion" pyinstaller --noconfirm --clean --log-level WARN --distpath (Join-Path $Work 'dist') --workpath (Join-Path $Work 'work') packaging\branchwise.spec
Invoke-Checked (Join-Path $Bundle 'branchwise-cli.exe') --help | Out-Null
foreach ($dll in 'vcomp140.dll', 'msvcp140.dll', 'vcruntime140.dll') {
    if (-not (Test-Path (Join-Path $Bundle "_internal\$dll"))) { throw "$dll is missing from the bundle" }
}

Say 'Inno Setup'
$Iscc = $env:ISCC
if (-not $Iscc) {
    $Iscc = @("${env:ProgramFiles(x86)}\Inno Setup 6\ISCC.exe", "$env:ProgramFiles\Inno Setup 6\ISCC.exe") |
        Where-Object { Test-Path $_ } | Select-Object -First 1
}
if (-not $Iscc) {
    Invoke-Checked choco install innosetup --no-progress -y
    $Iscc = "${env:ProgramFiles(x86)}\Inno Setup 6\ISCC.exe"
}
Invoke-Checked $Iscc /Q "/DAppVersion=$Version" "/DSourceDir=$Bundle" "/DOutputDir=$(Join-Path $Root 'dist')" packaging\windows\branchwise.iss

Say 'done'
$Setup = Join-Path $Root "dist\Branchwise-$Version-windows-x64-setup.exe"
$BundleMB = (Get-ChildItem $Bundle -Recurse -File | Measure-Object Length -Sum).Sum / 1MB
Write-Host ("bundle    {0:n0} MB  {1}" -f $BundleMB, $Bundle)
Write-Host ("artifact  {0:n0} MB  {1}" -f ((Get-Item $Setup).Length / 1MB), $Setup)
Write-Host ("elapsed   {0:n0}s" -f ((Get-Date) - $Start).TotalSeconds)
