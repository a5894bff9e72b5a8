; Inno Setup 6 script for the Branchwise Windows installer.
; Built by packaging\windows\build.ps1, which passes /DAppVersion, /DSourceDir and /DOutputDir:
;   ISCC.exe /DAppVersion=0.1.0 /DSourceDir=build\pyinstaller\dist\branchwise /DOutputDir=dist packaging\windows\branchwise.iss
; Produces <OutputDir>\Branchwise-<version>-windows-x64-setup.exe

#ifndef AppVersion
  #define AppVersion "0.0.0"
#endif
#ifndef SourceDir
  #define SourceDir "..\..\build\pyinstaller\dist\branchwise"
#endif
#ifndef OutputDir
  #define OutputDir "..\..\dist"
#endif

; llama.cpp's ggml-cpu.dll needs the MSVC OpenMP runtime, and llama.dll the C++ runtime.
; They are shipped app-locally in _internal (the spec collects them); refuse to build an
; installer that would fail on a PC without the Visual C++ redistributable.
#if !FileExists(AddBackslash(SourceDir) + "_internal\vcomp140.dll")
  #error "vcomp140.dll (OpenMP runtime) is missing from the bundle"
#endif
#if !FileExists(AddBackslash(SourceDir) + "_internal\msvcp140.dll")
  #error "msvcp140.dll (C++ runtime) is missing from the bundle"
#endif
#if !FileExists(AddBackslash(SourceDir) + "_internal\vcruntime140.dll")
  #error "vcruntime140.dll is missing from the bundle"
#endif

[Setup]
AppId={{6E0C3D52-8B7A-4F0B-9C55-2F3B1B7A9E41}
AppName=Branchwise
AppVersion={#AppVersion}
AppVerName=Branchwise {#AppVersion}
AppPublisher=Branchwise developers
DefaultDirName={autopf}\Branchwise
DefaultGroupName=Branchwise
DisableProgramGroupPage=yes
; Per-user install by default (no UAC prompt); the dialog offers an all-users install.
PrivilegesRequired=lowest
PrivilegesRequiredOverridesAllowed=dialog commandline
ArchitecturesAllowed=x64compatible
ArchitecturesInstallIn64BitMode=x64compatible
MinVersion=10.0
OutputDir={#OutputDir}
OutputBaseFilename=Branchwise-{#AppVersion}-windows-x64-setup
SetupIconFile=..\..\assets\branchwise.ico
UninstallDisplayIcon={app}\Branchwise.exe
UninstallDisplayName=Branchwise
Compression=lzma2/max
SolidCompression=yes
LZMANumBlockThreads=4
WizardStyle=modern
ChangesAssociations=no

[Languages]
Name: "english"; MessagesFile: "compiler:Default.isl"

[Tasks]
Name: "desktopicon"; Description: "{cm:CreateDesktopIcon}"; GroupDescription: "{cm:AdditionalIcons}"; Flags: unchecked

[Files]
; The whole PyInstaller onedir bundle: Branchwise.exe (window), branchwise-cli.exe (console,
; e.g. `branchwise-cli --self-test`), and _internal\ (Python, Qt, llama.cpp, the default model,
; vcomp140.dll / msvcp140.dll / vcruntime140*.dll).
Source: "{#SourceDir}\*"; DestDir: "{app}"; Flags: ignoreversion recursesubdirs createallsubdirs

[Icons]
Name: "{autoprograms}\Branchwise"; Filename: "{app}\Branchwise.exe"
Name: "{autodesktop}\Branchwise"; Filename: "{app}\Branchwise.exe"; Tasks: desktopicon

[Run]
Filename: "{app}\Branchwise.exe"; Description: "{cm:LaunchProgram,Branchwise}"; Flags: nowait postinstall skipifsilent

[UninstallDelete]
; Chats and the KV cache live in the user's data folder and are kept on uninstall.
Type: filesandordirs; Name: "{app}\_internal\__pycache__"
